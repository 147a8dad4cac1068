"""What a table's schema and constraints refuse, checked on a write task's rows before it
pre-commits.

Neither delta-rs nor pyiceberg checks the rows of a commit of files written elsewhere, and a
check at the commit would come after the decision, which every restart would replay into the
same error. So the task checks its rows; ``CHECK`` constraints are compiled from a subset of
SQL (docs/delta.md) into ``pyarrow.compute``, and a row passes only when true (not NULL).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

_FIX_NULLS = ("filter those rows out or fill the column (e.g. coalesce) before writeStream, "
              "or {relax}")


def refuse_nulls(batch: pa.RecordBatch, columns: Iterable[str], table: str, relax: str) -> None:
    """ValueError if a row has a NULL in one of ``table``'s NOT NULL ``columns``."""
    for name in columns:
        nulls = batch.column(name).null_count
        if nulls:
            raise ValueError(
                f"{table}: column {name!r} is NOT NULL there, but {nulls} row(s) of the "
                f"stream have it NULL; the epoch is not committed. Fix: "
                + _FIX_NULLS.format(relax=relax))


@dataclass(frozen=True)
class Check:

    name: str
    sql: str
    expression: pc.Expression = field(compare=False)


@dataclass(frozen=True)
class TableRules:

    table: str
    not_null: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()

    def refuse(self, batch: pa.RecordBatch, relax: str) -> None:
        """ValueError naming the first column or constraint a row of ``batch`` breaks."""
        refuse_nulls(batch, self.not_null, self.table, relax)
        for check in self.checks if batch.num_rows else ():
            passed = pc.fill_null(_evaluate(check.expression, batch), False)
            broken = batch.num_rows - pc.sum(passed.cast(pa.int64())).as_py()
            if broken:
                raise ValueError(
                    f"{self.table}: {broken} row(s) of the stream break its CHECK constraint "
                    f"{check.name!r} ({check.sql}); the epoch is not committed. Fix: filter "
                    "those rows out before writeStream, or drop the constraint")


def _evaluate(expression: pc.Expression, batch: pa.RecordBatch) -> pa.Array:
    import pyarrow.dataset as ds  # evaluates an expression over a batch's columns

    table = pa.Table.from_batches([batch])
    result = ds.dataset(table).to_table(columns={"v": expression}).column("v")
    return result.combine_chunks() if result.num_chunks != 1 else result.chunk(0)


_TOKEN = re.compile(r"""
    \s*(?:
      (?P<number>\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?)
    | (?P<string>'(?:[^']|'')*')
    | (?P<quoted>`(?:[^`]|``)*`|"(?:[^"]|"")*")
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op><=|>=|<>|!=|==|=|<|>|\(|\)|,|\+|-|\*|/|%)
    )""", re.VERBOSE)
_COMPARISONS = {"=": pc.equal, "==": pc.equal, "<>": pc.not_equal, "!=": pc.not_equal,
                "<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}
_ARITHMETIC = {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked,
               "/": pc.divide_checked}


class UnsupportedCheck(ValueError):
    """A constraint outside the SQL subset :func:`compile_check` understands."""


def compile_check(sql: str, schema: pa.Schema) -> pc.Expression:
    """A CHECK constraint's ``sql`` as a ``pyarrow.compute`` expression; UnsupportedCheck
    saying what is not understood."""
    parser = _Parser(_tokenize(sql), schema)
    expression = parser.disjunction()
    left = parser.peek()
    if left is not None:
        raise UnsupportedCheck(f"unexpected {left[1]!r}")
    # evaluated once over no rows: a type the functions cannot take shows now, not in a task
    try:
        _evaluate(expression, pa.RecordBatch.from_pylist([], schema=schema))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError,
            pa.ArrowKeyError) as exc:
        raise UnsupportedCheck(str(exc).splitlines()[0]) from None
    return expression


def _tokenize(sql: str) -> list[tuple[str, str]]:
    tokens = []
    position = 0
    text = sql.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise UnsupportedCheck(f"cannot read {text[position:].strip()[:20]!r}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match[kind]))
        position = match.end()
    return tokens


class _Parser:
    """Recursive descent over SQL's precedence: OR < AND < NOT < comparison/IS/IN/BETWEEN <
    + - < * / < unary minus < atoms."""

    def __init__(self, tokens: list[tuple[str, str]], schema: pa.Schema) -> None:
        self._tokens = tokens
        self._at = 0
        self._schema = schema
        #: by expression id: a column's type, a string literal's text (a literal compared with
        #: a date or timestamp column is read as one, as SQL does)
        self._columns: dict[int, pa.DataType] = {}
        self._strings: dict[int, str] = {}

    def peek(self) -> tuple[str, str] | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _next(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise UnsupportedCheck("the expression ends too early")
        self._at += 1
        return token

    def _keyword(self, *words: str) -> bool:
        upcoming = self._tokens[self._at:self._at + len(words)]
        if len(upcoming) == len(words) and all(
                kind == "word" and text.upper() == word
                for (kind, text), word in zip(upcoming, words, strict=True)):
            self._at += len(words)
            return True
        return False

    def _op(self, *ops: str) -> str | None:
        token = self.peek()
        if token is not None and token[0] == "op" and token[1] in ops:
            self._at += 1
            return token[1]
        return None

    def _expect(self, op: str) -> None:
        if self._op(op) is None:
            found = self.peek()
            raise UnsupportedCheck(f"expected {op!r}, found {found[1] if found else 'the end'!r}")

    def disjunction(self) -> Any:
        left = self._conjunction()
        while self._keyword("OR"):
            left = pc.or_kleene(left, self._conjunction())
        return left

    def _conjunction(self) -> Any:
        left = self._negation()
        while self._keyword("AND"):
            left = pc.and_kleene(left, self._negation())
        return left

    def _negation(self) -> Any:
        if self._keyword("NOT"):
            return pc.invert(self._negation())
        return self._predicate()

    def _predicate(self) -> Any:
        left = self._sum()
        if self._keyword("IS", "NOT", "NULL"):
            return pc.is_valid(left)
        if self._keyword("IS", "NULL"):
            return pc.is_null(left)
        if self._keyword("IS", "NOT", "DISTINCT", "FROM"):
            return self._same(left, self._sum())
        if self._keyword("IS", "DISTINCT", "FROM"):
            return pc.invert(self._same(left, self._sum()))
        negated = self._keyword("NOT")
        if self._keyword("IN"):
            self._expect("(")
            values = [self._sum()]
            while self._op(","):
                values.append(self._sum())
            self._expect(")")
            result = functools.reduce(pc.or_kleene,
                                      [pc.equal(*self._typed(left, v)) for v in values])
        elif self._keyword("BETWEEN"):
            low = self._sum()
            if not self._keyword("AND"):
                raise UnsupportedCheck("BETWEEN without AND")
            result = pc.and_kleene(pc.greater_equal(*self._typed(left, low)),
                                   pc.less_equal(*self._typed(left, self._sum())))
        elif negated:
            raise UnsupportedCheck("NOT where IN or BETWEEN was expected")
        else:
            op = self._op(*_COMPARISONS)
            return left if op is None else _COMPARISONS[op](*self._typed(left, self._sum()))
        return pc.invert(result) if negated else result

    def _same(self, left: Any, right: Any) -> Any:
        """``left IS NOT DISTINCT FROM right``: equal, or both NULL."""
        left, right = self._typed(left, right)
        return pc.if_else(pc.and_kleene(pc.is_null(left), pc.is_null(right)), pc.scalar(True),
                          pc.coalesce(pc.equal(left, right), pc.scalar(False)))

    def _typed(self, left: Any, right: Any) -> tuple[Any, Any]:
        """``left`` and ``right``, a string literal beside a date or timestamp column read as
        the column's type."""
        def read(literal: Any, column: Any) -> Any:
            dtype = self._columns.get(id(column))
            text = self._strings.get(id(literal))
            if dtype is None or text is None or not (
                    pa.types.is_timestamp(dtype) or pa.types.is_date(dtype)):
                return literal
            value = pa.scalar(text)
            try:
                return pc.scalar(value.cast(dtype))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
            try:  # without a zone offset: in UTC, as delta-rs reads it
                return pc.scalar(value.cast(pa.timestamp(dtype.unit)).cast(dtype))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, AttributeError) as exc:
                raise UnsupportedCheck(f"{text!r} is not a {dtype}: "
                                       f"{str(exc).splitlines()[0]}") from None

        return read(left, right), read(right, left)

    def _sum(self) -> Any:
        left = self._product()
        while (op := self._op("+", "-")) is not None:
            left = _ARITHMETIC[op](left, self._product())
        return left

    def _product(self) -> Any:
        left = self._unary()
        while (op := self._op("*", "/")) is not None:
            left = _ARITHMETIC[op](left, self._unary())
        return left

    def _unary(self) -> Any:
        if self._op("-"):
            return pc.negate_checked(self._unary())
        return self._atom()

    def _atom(self) -> Any:
        kind, text = self._next()
        if kind == "op" and text == "(":
            inner = self.disjunction()
            self._expect(")")
            return inner
        if kind == "number":
            value: Any = float(text) if any(c in text for c in ".eE") else int(text)
            return pc.scalar(value)
        if kind == "string":
            value = text[1:-1].replace("''", "'")
            literal = pc.scalar(value)
            self._strings[id(literal)] = value
            return literal
        if kind == "quoted":
            return self._column(text[1:-1].replace(text[0] * 2, text[0]))
        if kind == "word":
            upper = text.upper()
            if upper in ("TRUE", "FALSE"):
                return pc.scalar(upper == "TRUE")
            if upper == "NULL":
                return pc.scalar(None)
            if self.peek() == ("op", "("):
                raise UnsupportedCheck(f"function {text}()")
            return self._column(text)
        raise UnsupportedCheck(f"unexpected {text!r}")

    def _column(self, name: str) -> Any:
        found = [n for n in self._schema.names if n.lower() == name.lower()]
        if not found:
            raise UnsupportedCheck(f"{name!r} is not a column of the table")
        column = pc.field(found[0])
        self._columns[id(column)] = self._schema.field(found[0]).type
        return column
