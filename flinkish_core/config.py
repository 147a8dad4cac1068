"""Options declared once, like Flink's ``ConfigOptions.key(...)``: the parsers, the "did you
mean" errors and the docs' option reference (:func:`reference_table`) all read the
declarations. Spark lower-cases a sink's keys and passes a source's as given, so keys match in
any case and messages use the declared spelling.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

from flinkish_core.durations import parse_duration_ms
from flinkish_core.errors import OptionError

T = TypeVar("T")
E = TypeVar("E", bound=Enum)

#: how an option's text becomes its value: ``(key as documented, text) -> value``, raising
#: OptionError naming the key
Reader = Callable[[str, str], T]


@dataclass(frozen=True, eq=False)
class Option(Generic[T]):
    """One option, declared once.

    Args:
        key: the key as the documentation spells it; a key ending in ``.*`` is a prefix whose
            options are collected into a dict (``catalog.*``: ``catalog.uri`` -> ``uri``).
        read: how a given text becomes the value (see :data:`Reader`).
        default: the value when the option is not given.
        doc: the documentation's meaning of the option (Markdown).
        owner: who reads it: a source group (``kafka``, ``admission`` …) or ``sink``.
        shown_default: the documentation's Default column, when the default needs words
            (``required``, ``the query's id``); otherwise the default itself.
        aliases: other spellings accepted for the key.
        mask: how logs show a value holding credentials (None: as it is).
        secrets: the secret strings in a value, to scrub from messages.
    """

    key: str
    read: Reader[T]
    default: T
    doc: str
    owner: str = ""
    shown_default: str | None = None
    aliases: tuple[str, ...] = ()
    mask: Callable[[T], object] | None = None
    secrets: Callable[[T], list[str]] | None = None

    @property
    def prefix(self) -> str | None:
        """The prefix of a ``prefix.*`` option (``catalog.``), None for a plain key."""
        return self.key[:-1] if self.key.endswith(".*") else None

    def spellings(self) -> tuple[str, ...]:
        """The lower-case keys that name this option."""
        return tuple(k.lower() for k in (self.key, *self.aliases))

    def __repr__(self) -> str:
        return f"Option({self.key!r})"


def text(key: str, value: str) -> str:
    """The text as given."""
    return value


def optional_text(key: str, value: str) -> str | None:
    """The text, None when empty (an empty option is an option left out)."""
    return value or None


def collected(key: str, value: str) -> dict[str, str]:
    """The reader of a ``prefix.*`` option, whose options are collected into a dict instead."""
    raise AssertionError(f"option {key} is collected, not read")  # pragma: no cover


def boolean(key: str, value: str) -> bool:
    """``true`` or ``false``, in any case."""
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise OptionError(f"option {key}: {value!r} is not a boolean; use true or false")
    return word == "true"


def positive_duration_ms(key: str, value: str) -> int:
    """A duration above zero, in milliseconds."""
    ms = parse_duration_ms(key, value)
    if ms <= 0:
        raise OptionError(f"option {key} must be a positive duration")
    return ms


def whole_number(minimum: int, what: str) -> Reader[int]:
    """A whole number >= ``minimum``; ``what`` says what it counts in the error."""
    def read(key: str, value: str) -> int:
        stripped = value.strip()
        if not stripped.isdigit() or int(stripped) < minimum:
            raise OptionError(f"option {key}: {stripped!r} is not {what}")
        return int(stripped)
    return read


#: A duration (``"15 min"``) in milliseconds.
duration_ms: Reader[int] = parse_duration_ms


def choice(enum: type[E]) -> Reader[E]:
    """One of the enum's values, in any case."""
    def read(key: str, value: str) -> E:
        for member in enum:
            if member.value == value.strip().lower():
                return member
        accepted = ", ".join(str(m.value) for m in enum)
        raise OptionError(f"option {key}: {value!r} is not one of {accepted}")
    return read


def names(key: str, value: str) -> tuple[str, ...]:
    """Comma-separated names (columns), blanks ignored."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


_SIZE = re.compile(r"^(\d+)\s*([kmgt]?)i?b?$")


def size_bytes(key: str, value: str) -> int:
    """Bytes: a whole number with an optional unit (``128 MB``, ``64MiB``, ``1 GB``: powers
    of 1024)."""
    match = _SIZE.match(value.strip().lower())
    if not match or int(match[1]) < 1:
        raise OptionError(
            f"option {key}: {value!r} is not a positive size, e.g. '128 MB' or '1 GB'")
    return int(match[1]) * 1024 ** " kmgt".index(match[2] or " ")


def checked(read: Reader[T], check: Callable[[str, str, T], None]) -> Reader[T]:
    """``read``, then ``check(key, text, value)``, which raises OptionError for a value the
    type accepts but the option does not."""
    def both(key: str, value: str) -> T:
        result = read(key, value)
        check(key, value, result)
        return result
    return both


@dataclass(frozen=True)
class Given:
    """The options a user gave, by declared key: plain ones' texts, and each ``prefix.*``
    option's entries (key without the prefix: text)."""

    texts: Mapping[str, str]
    prefixed: Mapping[str, dict[str, str]]

    def __contains__(self, option: Option[Any]) -> bool:
        return option.key in self.texts or option.key in self.prefixed

    def value(self, option: Option[T]) -> T:
        """The option's value: its text read, or its default when it was not given."""
        if option.prefix is not None:
            return self.prefixed.get(option.key, {}) or option.default  # type: ignore[return-value]
        if option.key not in self.texts:
            return option.default
        return option.read(option.key, self.texts[option.key])


def match(raw: Mapping[str, Any], declared: Iterable[Option[Any]],
          unknown: Callable[[str, dict[str, Option[Any]]], OptionError]) -> Given:
    """Match the given options to ``declared``, in any case; raises ``unknown(key, declared
    by spelling)`` for the first key (sorted) that names no declared option."""
    by_spelling = {s: o for o in declared for s in o.spellings() if o.prefix is None}
    prefixes = [(o.prefix.lower(), o) for o in declared if o.prefix is not None]
    texts: dict[str, str] = {}
    prefixed: dict[str, dict[str, str]] = {}
    for key in sorted(raw, key=lambda k: str(k).lower()):
        lower = str(key).lower()
        option = by_spelling.get(lower)
        if option is not None:
            texts[option.key] = str(raw[key])
            continue
        owner = next((o for p, o in prefixes if lower.startswith(p)), None)
        if owner is None:
            raise unknown(lower, by_spelling)
        prefixed.setdefault(owner.key, {})[lower[len(owner.key) - 1:]] = str(raw[key])
    return Given(texts, prefixed)


def did_you_mean(key: str, by_spelling: Mapping[str, Option[Any]]) -> str:
    """``"; did you mean <key>?"`` naming the declared option closest to ``key``, or ``""``."""
    import difflib  # here: ~5 ms to import, for every reader process of a query otherwise

    close = difflib.get_close_matches(key.lower(), list(by_spelling), n=1)
    return f"; did you mean {by_spelling[close[0]].key}?" if close else ""


def reference_table(options: Iterable[Option[Any]],
                    where: Callable[[Option[Any]], str] | None = None,
                    required: Callable[[Option[Any]], str] = lambda option: "") -> str:
    """The Markdown table of the docs' option reference: Option, Default, Meaning, and
    ``where`` each option applies when given; ``required`` says where an option is required
    (``"for postgres"``), shown as its default."""
    head = "| Option | Default |" + (" Applies to |" if where else "") + " Meaning |"
    lines = [head, "|---" * (4 if where else 3) + "|"]
    for option in options:
        default = f"required {required(option)}" if required(option) else option.shown_default
        if default is None:
            shown = option.default
            if isinstance(shown, Enum):
                shown = shown.value
            default = "—" if shown in (None, "", (), {}) else f"`{shown}`"
        spelled = ", ".join(f"`{k}`" for k in (option.key, *option.aliases))
        lines.append(f"| {spelled} | {default} |" + (f" {where(option)} |" if where else "")
                     + f" {option.doc} |")
    return "\n".join(lines) + "\n"
