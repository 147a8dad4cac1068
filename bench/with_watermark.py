"""Benchmark: what ``flinkish.with_watermark`` costs per row on top of the least any consumer of
the source does (keep the record rows, drop the marker columns).

Run from the repository root: ``python bench/with_watermark.py [--rows N] [--repeat R]``.

Both pipelines read the same generated rows of the source's schema (one carrier row per
10,000, the rest records) in one batch query each into the ``noop`` sink, alternating, in one
run. ``with_watermark`` adds its observation (the barrier that keeps user predicates above
Spark's watermark node, see ``flinkish/spark_watermark.py``) and its record predicate; on a
batch DataFrame Spark removes the watermark node itself, so the difference is exactly what
``with_watermark`` adds per row in a streaming query. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flinkish  # noqa: E402
from flinkish.demo.spark_session import local_session  # noqa: E402
from flinkish_core.markers import KIND_CARRIER, KIND_RECORD, MARKER_COLUMNS  # noqa: E402
from flinkish_core.watermark import DEFAULT_HORIZON_MS  # noqa: E402

BASE_MS = 1_700_000_000_000
CARRIER_EVERY = 10_000


def rows(spark: Any, n: int) -> Any:
    """The source's columns: records one millisecond apart, and a carrier every CARRIER_EVERY
    rows holding the watermark of the records before it."""
    from pyspark.sql import functions as F

    i = F.col("id")
    carrier = i % CARRIER_EVERY == CARRIER_EVERY - 1
    wm = F.lit(BASE_MS) + i - CARRIER_EVERY
    return spark.range(n).select(
        F.col("id").cast("string").cast("binary").alias("key"),
        F.lit(b"{}").alias("value"),
        F.lit("events").alias("topic"),
        (i % 8).cast("int").alias("partition"),
        i.alias("offset"),
        F.timestamp_millis(F.lit(BASE_MS) + i).alias("timestamp"),
        F.lit(0).alias("timestampType"),
        F.when(carrier, F.timestamp_millis(wm + DEFAULT_HORIZON_MS))
        .otherwise(F.timestamp_millis(F.lit(BASE_MS) + i)).alias("eventTime"),
        F.when(carrier, F.lit(KIND_CARRIER)).otherwise(F.lit(KIND_RECORD)).alias("kind"),
        F.when(carrier, wm).alias("watermark"),
        F.lit(None).cast("string").alias("status"),
    )


def timed(df: Any) -> float:
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    from pyspark.sql import functions as F

    spark = local_session("bench-with-watermark")
    source = rows(spark, args.rows)
    plain = source.filter(F.col("kind") == KIND_RECORD).drop(*MARKER_COLUMNS)
    assert plain.count() == args.rows - args.rows // CARRIER_EVERY
    watermarked = flinkish.with_watermark(source)
    assert watermarked.count() == plain.count()  # the same rows: records only
    times: dict[str, list[float]] = {"plain": [], "with_watermark": []}
    timed(plain), timed(watermarked)  # warm-up: JIT and code generation
    for _ in range(args.repeat):
        times["plain"].append(timed(plain))
        times["with_watermark"].append(timed(watermarked))
    spark.stop()
    plain_s = statistics.median(times["plain"])
    wm_s = statistics.median(times["with_watermark"])
    print(json.dumps({
        "rows": args.rows,
        "plain_s": round(plain_s, 3),
        "with_watermark_s": round(wm_s, 3),
        "with_watermark_ns_per_row": round((wm_s - plain_s) / args.rows * 1e9, 1),
        "ratio_vs_plain": round(wm_s / plain_s, 3),
    }))


if __name__ == "__main__":
    main()
