"""Errors every layer raises, so a user catches them from one place (``flinkish``)."""

from __future__ import annotations


class OptionError(ValueError):
    """A wrong, missing or conflicting option; the message names it and says what is accepted."""


class WorkerEnvironmentError(RuntimeError):
    """Spark's Python workers cannot run flinkish (the wrong interpreter, flinkish not installed
    there); the message names the interpreter and the fix."""
