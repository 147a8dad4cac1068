"""Secrets never leave: a password in the sink's DSN (both libpq forms) appears in no repr, log
line, error message, checkpoint record or row the sink writes — checked against a real
PostgreSQL server that demands the password, and one that cannot be reached."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from flinkish.cli import main
from flinkish.demo.ports import free_port
from flinkish_core.errors import OptionError
from flinkish_sink.options import parse_sink_options
from flinkish_sink.outages import is_transient
from flinkish_sink.postgres_target import PostgresConnectError, PostgresTarget
from flinkish_sink.stream_writer import FlinkishStreamWriter, SinkCommitMessage
from flinkish_sink.target import TransactionId

pytestmark = pytest.mark.integration

QUERY = "7e3c1f00-aaaa-4bbb-8ccc-0123456789ab"


@contextlib.contextmanager
def password_role(dsn: str) -> Iterator[tuple[str, str, str]]:
    """A login role that must give its password (a pg_hba line for it alone, put first),
    on the session's server: yields (role, password, a DSN naming the role without password).
    Skips when the server's pg_hba.conf is not a file this test can edit (an external server)."""
    role = f"flinkish_pw_{uuid.uuid4().hex[:8]}"
    password = f"S3cret-{uuid.uuid4().hex}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW hba_file").fetchone()
        hba = Path(str(row[0])) if row else None
        if hba is None or not os.access(hba, os.W_OK):
            pytest.skip("cannot edit the server's pg_hba.conf to demand a password")
        original = hba.read_text()
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)))
        params = {k: v for k, v in conninfo_to_dict(dsn).items() if k != "password"}
        role_dsn = make_conninfo(**{**params, "user": role})
        try:
            hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{original}")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 10
            while True:  # the postmaster re-reads pg_hba.conf asynchronously
                try:
                    psycopg.connect(role_dsn, password="wrong", connect_timeout=5).close()
                except psycopg.OperationalError:
                    break
                if time.monotonic() > deadline:
                    pytest.skip("the server does not demand the password (pg_hba not applied)")
                time.sleep(0.05)
            yield role, password, role_dsn
        finally:
            hba.write_text(original)
            conn.execute("SELECT pg_reload_conf()")
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", [f"%{QUERY}%"]
            ).fetchall():
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _uri(role_dsn: str, role: str, password: str) -> str:
    params = conninfo_to_dict(role_dsn)
    return (f"postgresql://{role}:{password}@{params.get('host', '127.0.0.1')}:"
            f"{params.get('port', 5432)}/{params.get('dbname', 'postgres')}")


def _error_text(exc: BaseException) -> str:
    """What a user (or Spark, which formats the Python traceback) gets to see."""
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("form", ["key=value", "uri"])
def test_the_dsn_password_never_leaves(
    postgres_dsn: str, tmp_path: Path, form: str,
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    with password_role(postgres_dsn) as (role, password, role_dsn):
        wrong = f"Wr0ng-{uuid.uuid4().hex}"
        secrets = [password, wrong]
        if form == "uri":
            dsn, bad_dsn = _uri(role_dsn, role, password), _uri(role_dsn, role, wrong)
            unreachable = f"postgresql://{role}:{password}@127.0.0.1:{free_port()}/x"
        else:
            dsn, bad_dsn = f"{role_dsn} password={password}", f"{role_dsn} password={wrong}"
            unreachable = f"host=127.0.0.1 port={free_port()} user={role} password={password}"
        table = f"secret_{uuid.uuid4().hex[:8]}"
        checkpoint = tmp_path / "ck"
        checkpoint.mkdir()
        (checkpoint / "metadata").write_text(f'{{"id":"{QUERY}"}}\n')
        raw = {"target": "postgres", "dsn": dsn, "table": table,
               "checkpointLocation": str(checkpoint), "queryName": "secrets"}
        seen: list[str] = []

        # reprs of everything that holds the DSN
        options = parse_sink_options(raw)
        from pyspark.sql.types import LongType, StructField, StructType

        schema = StructType([StructField("v", LongType())])
        writer = FlinkishStreamWriter(schema, raw)  # connects: checks and creates the table
        seen += [repr(options), str(options), repr(writer._options), repr(writer._target),
                 repr(vars(writer))]
        assert "***" in repr(options)

        # option errors
        for bad in ({"deliveryGuarantee": "twice"}, {"lateData": "side"}, {"dsnn": "x"},
                    {"eventTimeColumn": "v"}):
            with pytest.raises(OptionError) as option_error:
                FlinkishStreamWriter(schema, {**raw, **bad})
            seen.append(_error_text(option_error.value))

        # connection failures: a wrong password, an unreachable server
        with pytest.raises(PostgresConnectError) as refused:
            PostgresTarget(bad_dsn, table).check(pa.schema([("v", pa.int64())]))
        assert "password authentication failed" in str(refused.value)
        assert not is_transient(refused.value)  # a refused login is never waited out
        with pytest.raises(PostgresConnectError) as unreachable_error:
            FlinkishStreamWriter(schema, {**raw, "dsn": unreachable, "outageTimeout": "0"})
        assert "Connection refused" in str(unreachable_error.value)
        seen += [_error_text(refused.value), _error_text(unreachable_error.value)]

        # two epochs through the driver's commit: checkpoint records and the epochs table
        arrow = pa.schema([("v", pa.int64())])
        target = PostgresTarget(dsn, table)
        for epoch in (0, 1):
            txn = target.begin_transaction(TransactionId("flinkish", QUERY, epoch, 0, 0, "r1"),
                                           arrow)
            txn.write(pa.record_batch([pa.array([epoch, epoch + 10])], schema=arrow))
            message = SinkCommitMessage(0, [txn.pre_commit().to_json()], [], 2, 0)
            writer.commit([message], epoch)
        target.close()

        # the operator's CLI, with the good and the wrong password
        assert main(["transactions", "--postgres", dsn, "--table", table,
                     "--checkpoint", str(checkpoint)]) == 0
        with pytest.raises(PostgresConnectError) as cli_error:
            main(["transactions", "--postgres", bad_dsn, "--table", table, "--query", QUERY])
        seen += [capsys.readouterr().out, _error_text(cli_error.value)]

        with psycopg.connect(dsn, autocommit=True) as conn:
            epochs = conn.execute(
                sql.SQL("SELECT * FROM {}").format(sql.Identifier(f"{table}_flinkish_epochs"))
            ).fetchall()
            assert [row[1] for row in epochs] == [0, 1]
            seen.append(repr(epochs))
            seen.append(repr(conn.execute("SELECT * FROM pg_prepared_xacts").fetchall()))
            assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(table))).fetchone() == (4,)
            conn.execute(sql.SQL("DROP TABLE {}, {}").format(
                sql.Identifier(table), sql.Identifier(f"{table}_flinkish_epochs")))

        files = _files(tmp_path)
        assert any("completed" in name for name in files)  # the records were written
        logged = [r.getMessage() + (_error_text(r.exc_info[1]) if r.exc_info and r.exc_info[1]
                                    else "") for r in caplog.records]
        assert any("epoch 1 committed" in line for line in logged)
        for secret in secrets:
            for text in [*seen, *logged]:
                assert secret not in text, f"secret shown in: {text[:300]}"
            for name, data in files.items():
                assert secret.encode() not in data, f"secret written to {name}"


def test_a_checkpoint_or_target_uri_with_credentials_is_masked_in_errors(tmp_path: Any) -> None:
    from checkpointing import CheckpointStorage
    from flinkish_sink.parquet_target import ParquetTarget

    secret = f"S3cret{uuid.uuid4().hex}"
    for build in (lambda: CheckpointStorage.open(f"nosuchfs://AKIA:{secret}@bucket/ck"),
                  lambda: ParquetTarget(f"nosuchfs://AKIA:{secret}@bucket/out")):
        with pytest.raises(ValueError) as failure:
            build()
        assert secret not in _error_text(failure.value)
        assert "AKIA:***@bucket" in str(failure.value)
