"""Built-in tasks. Importing this package registers them (see `mechopd.tasks.base.register_task`)."""

from mechopd.tasks.base import Example, Episode, Task, get_task, register_task, task_names

from mechopd.tasks import rules  # noqa: F401  (registers "rules")

try:  # the game and JSONL modules register "frozenlake", "sokoban", "jsonl"
    from mechopd.tasks import frozenlake, sokoban  # noqa: F401
except ImportError:  # pragma: no cover - during bootstrap only
    pass
try:
    from mechopd.tasks import jsonl  # noqa: F401
except ImportError:  # pragma: no cover
    pass

__all__ = ["Example", "Episode", "Task", "get_task", "register_task", "task_names"]
