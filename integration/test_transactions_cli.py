"""``flinkish transactions``: an operator lists what a stopped query left prepared in
PostgreSQL and resolves it from the query's decision records."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from checkpointing import CheckpointStorage, CheckpointStore
from flinkish.cli import main
from flinkish_sink.postgres_target import PostgresTarget
from flinkish_sink.target import TransactionId
from flinkish_sink.two_phase_commit import TwoPhaseCommitCoordinator

QUERY = "5d1c0e2a-1111-4222-8333-944455556666"


def test_list_then_resolve_lingering_prepared_transactions(
    postgres_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = pa.schema([("v", pa.int64())])
    target = PostgresTarget(postgres_dsn, "ops_events")
    target.check(schema)
    decided = target.begin_transaction(TransactionId("ops", QUERY, 4, 0, 0, "r1"), schema)
    decided.write(pa.record_batch([pa.array([1, 2])], schema=schema))
    decided_pc = decided.pre_commit()
    orphan = target.begin_transaction(TransactionId("ops", QUERY, 4, 1, 0, "r1"), schema)
    orphan.write(pa.record_batch([pa.array([99])], schema=schema))
    orphan.pre_commit()  # a failed attempt's pre-commit the decision does not name

    checkpoint = tmp_path / "ck"
    (checkpoint).mkdir()
    (checkpoint / "metadata").write_text(f'{{"id":"{QUERY}"}}\n')
    store = CheckpointStore(CheckpointStorage.open(str(checkpoint / "flinkish")), owner=QUERY)
    store.begin(4, {"decision": [decided_pc.to_json()], "markers": [], "rows": 2,
                    "late_rows": 0})

    args = ["transactions", "--postgres", postgres_dsn, "--table", "ops_events",
            "--prefix", "ops", "--checkpoint", str(checkpoint)]
    assert main(args) == 0
    listed = capsys.readouterr().out
    assert f"ops:{QUERY}:4:0:0:r1" in listed and f"ops:{QUERY}:4:1:0:r1" in listed
    # each one's age, from pg_prepared_xacts.prepared: just prepared, so not yet "old"
    lines = [line for line in listed.splitlines() if "lingering pre-commit" in line]
    assert len(lines) == 2 and all("ago" in line for line in lines)
    assert all(re.search(r"prepared \d+(\.\d)? (ms|s) ago", line) for line in lines), lines
    assert "older than" not in listed
    time.sleep(0.05)
    assert main([*args, "--transaction-timeout", "10 ms"]) == 0
    flagged = capsys.readouterr().out
    assert flagged.count("older than 10 ms") == 2 and "--resolve" in flagged

    assert main([*args, "--resolve"]) == 0
    resolved = capsys.readouterr().out
    assert resolved.count("resolved ") == 2
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT v FROM ops_events ORDER BY v").fetchall() == [(1,), (2,)]
        assert conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'ops:%'"
                            ).fetchall() == []
    assert main(args) == 0
    assert "no lingering pre-commits" in capsys.readouterr().out
    target.close()


def test_the_sink_warns_about_its_own_long_prepared_transactions(
    postgres_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Flink's transactionTimeout warning, with the age PostgreSQL reports."""
    schema = pa.schema([("v", pa.int64())])
    target = PostgresTarget(postgres_dsn, "ops_aged")
    target.check(schema)
    query = "6e2d1f3b-2222-4333-8444-a55566667777"
    mine = target.begin_transaction(TransactionId("aged", query, 1, 0, 0, "r1"), schema)
    mine.write(pa.record_batch([pa.array([7])], schema=schema))
    mine.pre_commit()
    other = target.begin_transaction(TransactionId("aged", QUERY, 1, 0, 0, "r1"), schema)
    other.write(pa.record_batch([pa.array([8])], schema=schema))
    other.pre_commit()  # another query's: not ours to warn about or resolve
    time.sleep(0.2)
    ages = target.pending_ages("aged", query)
    assert list(ages) == [mine.txn] and 0.2 <= (ages[mine.txn] or 0) < 60

    store = CheckpointStore(CheckpointStorage.open(str(tmp_path / "store")), owner=query)
    caplog.set_level(logging.WARNING)
    coordinator = TwoPhaseCommitCoordinator(store, target, "aged", query,
                                            transaction_timeout_s=0.1)
    assert coordinator.recover() == ([], [mine.txn.gid])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and mine.txn.gid in warnings[0]
    assert "longer than transactionTimeout (100 ms)" in warnings[0]
    assert "VACUUM" in warnings[0] and "rolling it back now" in warnings[0]
    target.rollback(other.txn)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE ops_aged, ops_aged_flinkish_epochs")
    target.close()
