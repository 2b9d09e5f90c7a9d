"""User-facing errors.

Every error a user can cause (bad config, bad file, bad flag) is a ``MechopdError`` subclass whose message names the
file / field / value and the fix. The CLI prints ``error: <message>`` on one line and exits with code 2.
"""

from __future__ import annotations


class MechopdError(Exception):
    """Base class for errors caused by user input. ``str(err)`` is one line naming the problem and its fix."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))  # always one line


class ConfigError(MechopdError):
    """A config field, YAML key or CLI flag has an invalid value."""


class DataError(MechopdError):
    """A data file (JSONL, context file, bank) is missing, empty or malformed."""


class ModelError(MechopdError):
    """A model path / checkpoint is missing, not a causal LM, lacks a tokenizer, or has an unsupported architecture."""


class TaskError(MechopdError):
    """Unknown task, or a task that does not fit the model (tokens missing, prompt too long)."""


class TrainingError(MechopdError):
    """Training cannot proceed: non-finite loss, existing run directory without --resume, ..."""
