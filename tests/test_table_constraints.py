"""The CHECK constraints a table target's write tasks evaluate: SQL's meaning over a batch's
rows (NULL propagating, a row passing only when true), and a constraint outside the subset
refused with what is not understood."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flinkish_sink.table_constraints import (
    Check,
    TableRules,
    UnsupportedCheck,
    compile_check,
)

SCHEMA = pa.schema([("x", pa.int64()), ("s", pa.string()), ("f", pa.float64()),
                    ("t", pa.timestamp("us", tz="UTC")), ("d", pa.date32())])
ROWS = pa.record_batch([
    pa.array([1, None, -1, 5]),
    pa.array(["a", "b", None, "it's"]),
    pa.array([0.5, 2.0, None, 3.0]),
    pa.array([0, 1_700_000_000_000_000, None, 1_600_000_000_000_000],
             pa.timestamp("us", tz="UTC")),
    pa.array([0, 19_000, None, 18_000], pa.date32()),
], schema=SCHEMA)


@pytest.mark.parametrize(("sql", "passing"), [
    ("x > 0", [True, False, False, True]),  # NULL fails, as in delta-rs' writer
    ("x > 0 OR x IS NULL", [True, True, False, True]),
    ("NOT (x < 0)", [True, False, False, True]),
    ("x BETWEEN 0 AND 3", [True, False, False, False]),
    ("s IN ('a', 'b')", [True, True, False, False]),
    ("s NOT IN ('a')", [False, True, False, True]),
    ("s = 'it''s'", [False, False, False, True]),
    ("`x` * 2 + 1 >= f * 6 AND -x < 3", [True, False, False, False]),
    ('"x" <> 5 AND x != 1', [False, False, True, False]),
    ("t >= '2023-11-14 22:13:20'", [False, True, False, False]),
    ("t < '2021-01-01T00:00:00Z' AND d > '1970-01-01'", [False, False, False, True]),
    ("(x > 0) IS NOT DISTINCT FROM true", [True, False, False, True]),
    ("s IS DISTINCT FROM NULL", [True, True, False, True]),
    ("X > 0 and TRUE", [True, False, False, True]),  # names and keywords in any case
])
def test_a_constraint_means_what_sql_says(sql: str, passing: list[bool]) -> None:
    rules = TableRules("t", checks=(Check("c", sql, compile_check(sql, SCHEMA)),))
    for row, passes in enumerate(passing):
        one = ROWS.slice(row, 1)
        if passes:
            rules.refuse(one, "relax")
        else:
            with pytest.raises(ValueError, match=r"1 row\(s\) of the stream break its CHECK "
                                                 r"constraint 'c'"):
                rules.refuse(one, "relax")


@pytest.mark.parametrize(("sql", "why"), [
    ("upper(s) = s", r"function upper\(\)"),
    ("s LIKE 'a%'", "unexpected 'LIKE'"),
    ("y > 0", "'y' is not a column"),
    ("x >", "ends too early"),
    ("t > 'yesterday'", "'yesterday' is not a timestamp"),
    ("s > 1", "no kernel matching"),
])
def test_a_constraint_outside_the_subset_is_refused(sql: str, why: str) -> None:
    with pytest.raises(UnsupportedCheck, match=why):
        compile_check(sql, SCHEMA)


def test_not_null_columns_name_the_column() -> None:
    rules = TableRules("Delta table 't'", not_null=("s",))
    with pytest.raises(ValueError, match=r"Delta table 't': column 's' is NOT NULL there, but "
                                         r"1 row\(s\) of the stream have it NULL.*DROP"):
        rules.refuse(ROWS, "ALTER TABLE … DROP NOT NULL")
    rules.refuse(ROWS.slice(0, 2), "")
