"""Built-in tasks. Importing this package registers them (see `mechopd.tasks.base.register_task`)."""

from mechopd.tasks import (  # noqa: F401,E402  (register the built-in tasks)
    facts,
    frozenlake,
    jsonl,
    rules,
    sokoban,
    textarena_engine,  # noqa: F401,E402  (registers engine=textarena for the games)
)
from mechopd.tasks.base import Episode, Example, Task, get_task, register_task, task_names

__all__ = ["Example", "Episode", "Task", "get_task", "register_task", "task_names"]
