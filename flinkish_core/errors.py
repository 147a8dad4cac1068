"""Errors every layer raises, so a user catches them from one place (``flinkish``)."""

from __future__ import annotations


class OptionError(ValueError):
    """A wrong, missing or conflicting option; the message names it and says what is accepted."""
