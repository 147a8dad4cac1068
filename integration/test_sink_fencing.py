"""Fencing through Spark: the sink's commit messages carry the query's runId, one run keeps one
claim on its checkpoint store for all its epochs, and the next run claims anew. (Two drivers on
one checkpoint: tests/test_sink_fencing.py, at the sink's commit.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from checkpointing import CheckpointStorage
from checkpointing.fencing import OWNER_RECORD
from integration.kafka_helpers import produce, source

B = 1_700_000_000_000


def _owner(checkpoint: Path) -> dict[str, Any]:
    record: dict[str, Any] = CheckpointStorage.open(str(checkpoint / "flinkish")).read_json(
        OWNER_RECORD)
    return record


def _run(df: Any, checkpoint: Path, out: Path) -> Any:
    query = (
        df.writeStream.format("flinkish").option("checkpointLocation", str(checkpoint))
        .option("target", "parquet").option("path", str(out))
        .trigger(availableNow=True).start()
    )
    query.awaitTermination(300)
    assert not query.isActive
    if query.exception() is not None:
        raise query.exception()
    return query


def test_a_run_keeps_one_claim_and_a_restart_claims_anew(
    spark: Any, kafka_bootstrap: str, topic: Any, tmp_path: Path
) -> None:
    name = topic(1)
    produce(kafka_bootstrap, name, [(0, f"k{i}".encode(), b"{}", B + i) for i in range(9)])

    def stream() -> Any:
        return source(spark, kafka_bootstrap, name, str(tmp_path / "state"),
                      maxOffsetsPerTrigger="3").selectExpr(
            "CAST(key AS STRING) AS k", "topic", "partition", "offset", "eventTime", "kind",
            "watermark", "status")

    checkpoint, out = tmp_path / "ck", tmp_path / "out"
    first = _run(stream(), checkpoint, out)
    assert len(list((checkpoint / "flinkish" / "completed").iterdir())) >= 3  # several epochs
    claim = _owner(checkpoint)
    assert (claim["generation"], claim["run"]) == (1, str(first.runId))

    produce(kafka_bootstrap, name, [(0, b"k9", b"{}", B + 9)])
    second = _run(stream(), checkpoint, out)
    claim = _owner(checkpoint)
    assert (claim["generation"], claim["run"]) == (2, str(second.runId))
    assert claim["superseded_runs"] == [str(first.runId)]
