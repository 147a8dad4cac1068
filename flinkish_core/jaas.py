"""Kafka's ``sasl.jaas.config`` read exactly as the Java client reads it, so that an option set
written for Spark's ``format("kafka")`` means the same here.

The port follows Kafka's ``org.apache.kafka.common.security.JaasConfig``, which tokenizes with
``java.io.StreamTokenizer``: characters 0-32 are blanks; 33-128 and 160-255 (and any above 255)
make words; ``;`` and ``=`` are tokens of their own; ``'`` and ``"`` quote (a backslash escapes
inside quotes, octal and C escapes included, and a quote ends at the end of a line); ``/``
starts a comment, to the end of the line (``//`` or a lone ``/``) or to ``*/``. An entry is
``<login module class> <control flag> (<name>=<value>)* ;``. Errors name the position and the
option, never a value: values are passwords.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["JaasEntry", "JaasError", "parse_jaas_config", "parse_jaas_entries"]

CONTROL_FLAGS = ("required", "requisite", "sufficient", "optional")

_EOF = "eof"
_WORD = "word"
_QUOTED = "quoted"
_ORDINARY = "ordinary"

#: StreamTokenizer's octal escape: a third digit only after 0-3
_OCTAL = re.compile(r"[0-3][0-7]{0,2}|[4-7][0-7]?")
_C_ESCAPES = {"a": "\x07", "b": "\b", "f": "\x0c", "n": "\n", "r": "\r", "t": "\t", "v": "\x0b"}


class JaasError(ValueError):
    """A ``sasl.jaas.config`` Kafka would refuse; the message holds no option value."""


@dataclass(frozen=True)
class JaasEntry:
    """One login module: its class, control flag (lower case) and options."""

    login_module: str
    control_flag: str
    options: dict[str, str] = field(repr=False)  # values are secrets


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str | None  # a word's or quoted string's value; an ordinary character itself
    at: int  # where the token starts (0-based character offset)


def _is_blank(c: str) -> bool:
    return ord(c) <= 32


def _is_word(c: str) -> bool:
    n = ord(c)
    if c in "/;='\"":
        return False
    return 32 < n <= 128 or n >= 160


class _Tokenizer:
    """``java.io.StreamTokenizer`` with the syntax ``JaasConfig`` sets up."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._pos = 0

    def _peek(self, ahead: int = 0) -> str | None:
        i = self._pos + ahead
        return self._text[i] if i < len(self._text) else None

    def next(self) -> _Token:
        text = self._text
        while True:
            while self._pos < len(text) and _is_blank(text[self._pos]):
                self._pos += 1
            at = self._pos
            c = self._peek()
            if c is None:
                return _Token(_EOF, None, at)
            if _is_word(c):
                end = at
                while end < len(text) and _is_word(text[end]):
                    end += 1
                self._pos = end
                return _Token(_WORD, text[at:end], at)
            if c in "'\"":
                return self._quoted(c, at)
            if c == "/":
                after = self._peek(1)
                self._pos += 2  # StreamTokenizer reads the character after '/' in any case
                if after == "*":
                    if not self._block_comment():
                        return _Token(_EOF, None, len(text))
                    continue
                # '//' or a lone '/' (whose next character, even a line break, is gone):
                # the rest of the line is a comment
                while self._pos < len(text) and text[self._pos] not in "\r\n":
                    self._pos += 1
                continue
            self._pos += 1
            return _Token(_ORDINARY, c, at)

    def _read(self) -> str | None:
        c = self._peek()
        self._pos += 1
        return c

    def _block_comment(self) -> bool:
        """Skip to the ``*/`` closing a ``/*`` comment (StreamTokenizer reads the character
        after a line break unchecked); False at the end of input."""
        previous: str | None = None
        c = self._read()
        while not (c == "/" and previous == "*"):
            if c == "\r":
                c = self._read()
                if c == "\n":
                    c = self._read()
            elif c == "\n":
                c = self._read()
            if c is None:
                return False
            previous = c
            c = self._read()
        return True

    def _quoted(self, quote: str, at: int) -> _Token:
        text = self._text
        i = at + 1
        out: list[str] = []
        while i < len(text) and text[i] != quote and text[i] not in "\r\n":
            c = text[i]
            i += 1
            if c != "\\":
                out.append(c)
                continue
            if i >= len(text):
                out.append("\uffff")  # StreamTokenizer stores the end of input as (char) -1
                break
            octal = _OCTAL.match(text, i)
            if octal:
                out.append(chr(int(octal[0], 8)))
                i = octal.end()
            else:
                out.append(_C_ESCAPES.get(text[i], text[i]))
                i += 1
        if i < len(text) and text[i] == quote:
            i += 1  # the closing quote; a line end or the end of input is left to the next
        self._pos = i
        return _Token(_QUOTED, "".join(out), at)


def _where(token: _Token) -> str:
    return f"at character {token.at + 1}"


def _entry(tokens: _Tokenizer, first: _Token) -> JaasEntry:
    if first.kind not in (_WORD, _QUOTED) or not first.text:
        raise JaasError(f"a login module class name is expected {_where(first)}")
    module = first.text
    flag = tokens.next()
    if flag.kind == _EOF:
        raise JaasError(f"login module {module}: the control flag is missing (write "
                        f"'{module} required ...;')")
    if flag.kind not in (_WORD, _QUOTED) or (flag.text or "").lower() not in CONTROL_FLAGS:
        raise JaasError(
            f"login module {module}: the control flag {_where(flag)} is not one of "
            + ", ".join(CONTROL_FLAGS) + f" (write '{module} required ...;')")
    options: dict[str, str] = {}
    token = tokens.next()
    while token.kind != _EOF and not (token.kind == _ORDINARY and token.text == ";"):
        key = token.text if token.kind in (_WORD, _QUOTED) else None
        equals = tokens.next()
        value = tokens.next() if equals.kind == _ORDINARY and equals.text == "=" else None
        if key is None or value is None or value.kind not in (_WORD, _QUOTED):
            named = f"option {key!r}" if key is not None else "an option name"
            raise JaasError(
                f"login module {module}: {named} {_where(token)} needs a value "
                "(name=value, quoted if it holds blanks, ';', '=' or '/')")
        options[key] = value.text or ""
        token = tokens.next()
    if token.kind == _EOF:
        raise JaasError(
            f"login module {module}: the entry is not terminated by ';' (a quote left open "
            "runs to the end of its line)")
    return JaasEntry(module, (flag.text or "").lower(), options)


def parse_jaas_entries(text: str) -> list[JaasEntry]:
    """Every entry of a JAAS configuration, as Kafka's ``JaasConfig`` reads it."""
    tokens = _Tokenizer(text)
    entries = []
    token = tokens.next()
    while token.kind != _EOF:
        entries.append(_entry(tokens, token))
        token = tokens.next()
    if not entries:
        raise JaasError("no login module is given")
    return entries


def parse_jaas_config(text: str) -> JaasEntry:
    """A client's ``sasl.jaas.config``: exactly one login module (Kafka's ``JaasContext``)."""
    entries = parse_jaas_entries(text)
    if len(entries) != 1:
        raise JaasError(
            f"{len(entries)} login modules are given ("
            + ", ".join(e.login_module for e in entries) + "); a client takes exactly one")
    return entries[0]
