"""``flinkish transactions``: an operator lists what a stopped query left prepared in
PostgreSQL and resolves it from the query's decision records."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from checkpointing import CheckpointStorage, CheckpointStore
from flinkish.cli import main
from flinkish_sink.postgres_target import PostgresTarget
from flinkish_sink.target import TransactionId

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
