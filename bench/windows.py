"""Benchmark: a keyed tumbling count through ``flinkish.windows`` (Flink's window operator on
Spark's stateful operators) against Spark's own ``groupBy(window(...), key).count()``.

Run from the repository root: ``python bench/windows.py [--records N] [--keys K]``.

One topic (4 partitions, records 1 ms apart per partition with up to 1 s of jitter, so
``--records`` / 4 ms of event time) is read by both queries in one Spark session, each through
the flinkish source and ``flinkish.with_watermark`` (bounded: ``endingOffsets``, so every
window closes), ``maxOffsetsPerTrigger`` = ``--batch``, ``Trigger.AvailableNow``, both on the
RocksDB state store. A record's key is one of ``--keys`` (from its partition and offset);
windows are 10 s. flinkish's query is ``window()`` as a user calls it (its default operator and
key groups, or ``--key-groups``). Each query's firings are summed per batch (``foreachBatch``):
both must count every record. Figures: records per second of each query (start to end, after an
untimed warm-up of both on a small topic; ``--repeat`` runs of each, alternating, each round
starting with the query the last one ended with, medians), their ratio
(``ratio_vs_spark_window``, target >= 0.8), the peak state rows of each (``numRowsTotal``: for
Spark one row per open window and key; for flinkish one state row per key group with open
windows), and ``worker_peak_rss_mb``: the largest peak resident set (VmHWM, the kernel's
high-water mark) of the Python processes Spark ran during flinkish's runs (workers are reused
from query to query, so a worker's mark includes what it ran before). The last line printed is
JSON (``print_result``: one json object on one line), with each run's seconds and CPU seconds
(Spark's JVM, PySpark's Python processes: steadier than wall times on a shared machine).
``--variants applyInPandasWithState:128`` also runs ``window()`` with another number of key
groups in the same rounds; each adds its figures (``applyInPandasWithState:128_...``, with its
ratio to the default as ``..._ratio_vs_flinkish``) to the JSON line.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _common import (  # noqa: E402
    CpuMeter,
    PeakMemorySampler,
    bench_environment,
    log,
    median,
    print_result,
    run_to_end,
)

from flinkish import windows  # noqa: E402

PARTITIONS = 4
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class Totals:
    """A foreachBatch sink summing the firings' counts and counting the windows."""

    def __init__(self, count_column: str, kind: str | None) -> None:
        self.count_column, self.kind = count_column, kind
        self.records = self.windows = 0
        self.lock = threading.Lock()

    def __call__(self, batch: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        if self.kind is not None:
            batch = batch.filter(F.col("kind") == self.kind)
        windows, records = batch.agg(F.count("*"), F.sum(self.count_column)).first()
        with self.lock:
            self.windows += windows
            self.records += records or 0


#: Spark's own window count; the other queries are flinkish.windows: "flinkish" as window()
#: runs by default, and each --variants entry, "<operator>" or "<operator>:<key groups>"
SPARK = "spark"
FLINKISH = "flinkish"


def _run(spark: Any, env: Any, topic: str, name: str, args: argparse.Namespace,
         query: str) -> dict[str, float]:
    from pyspark.sql import functions as F

    import flinkish

    events = (
        spark.readStream.format("flinkish")
        .option("kafka.bootstrap.servers", env.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("maxOffsetsPerTrigger", str(args.batch))
        .option("watermark.maxOutOfOrderness", "1 second")
        .option("checkpointing.location", str(env.workdir / f"{name}-state"))
        .load()
    )
    keyed = flinkish.with_watermark(events).select(
        (F.pmod(F.col("offset"), args.keys // PARTITIONS) * PARTITIONS + F.col("partition"))
        .alias("k"), "eventTime")
    if query != SPARK:
        variant: dict[str, Any] = {}
        if query == FLINKISH and args.key_groups is not None:
            variant["key_groups"] = args.key_groups
        elif query != FLINKISH:
            operator, _, key_groups = query.partition(":")
            variant["operator"] = operator
            if key_groups:
                variant["key_groups"] = int(key_groups)
        counts = windows.window(
            keyed, key="k", assigner=windows.tumbling("10 seconds"), aggregate=windows.Count(),
            **variant)
        totals = Totals("result", "result")
    else:
        counts = keyed.groupBy(F.window("eventTime", "10 seconds"), "k").count()
        totals = Totals("count", None)
    writer = (counts.writeStream.foreachBatch(totals).outputMode("append")
              .option("checkpointLocation", str(env.workdir / f"{name}-ck"))
              .trigger(availableNow=True))
    with PeakMemorySampler() as sampler, CpuMeter() as cpu:
        run = run_to_end(writer, f"{name} query", 3600)
    peak = max((op.get("numRowsTotal", 0) for p in run.progress
                for op in p.get("stateOperators", [])), default=0)
    log(f"{name}: {run.seconds:.1f} s, {len(run.progress)} batches, {totals.windows:,} windows "
        f"counting {totals.records:,} records, peak state rows {peak:,}, Python workers' "
        f"peak RSS {sampler.peak_mb} MB, CPU seconds {cpu.seconds}")
    return {"seconds": run.seconds, "records": float(totals.records),
            "jvm_cpu": cpu.seconds.get("spark_jvm", 0.0),
            "python_cpu": cpu.seconds.get("python_workers", 0.0),
            "windows": float(totals.windows), "peak_state_rows": float(peak),
            "peak_rss_mb": sampler.peak_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=50_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--key-groups", dest="key_groups", type=int,
                        help="window(key_groups=...) (default: the operator's)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each query, alternating; figures are medians")
    parser.add_argument("--variants", default="", help=(
        "also run flinkish.windows as these (comma-separated 'operator' or "
        "'operator:key_groups', e.g. applyInPandasWithState:128)"))
    args = parser.parse_args()
    if args.keys % PARTITIONS:
        parser.error(f"--keys must be a multiple of {PARTITIONS}")

    with bench_environment("flinkish-bench-windows-") as env:
        env.prepare_topics(PARTITIONS, 100, ("windows", args.records),
                           ("windows-warmup", args.batch), "both queries read this topic")
        spark, _ = env.start_spark("flinkish-bench-windows", 2)
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        import flinkish

        flinkish.register(spark)
        variants = [v for v in args.variants.split(",") if v]
        queries = [FLINKISH, *variants, SPARK]
        for query in reversed(queries):
            _run(spark, env, "windows-warmup", f"warmup-{query}", args, query)
        runs: dict[str, list[dict[str, float]]] = {query: [] for query in queries}
        for i in range(args.repeat):
            # each round starts with the query the last one ended with: the JVM still warms up
            # from run to run, and the later queries of a round run warmer than the first
            for query in (queries if i % 2 == 0 else queries[::-1]):
                runs[query].append(_run(spark, env, "windows", f"{query}-{i}", args, query))
    lost = [r["records"] for kind in runs.values() for r in kind if r["records"] != args.records]
    if lost:
        raise SystemExit(f"a query lost records: counted {lost} of {args.records:,}")
    rps = {query: median([args.records / r["seconds"] for r in kind])
           for query, kind in runs.items()}
    flinkish_rps, spark_rps = rps[FLINKISH], rps[SPARK]
    others = {f"{name}_{figure}": value for name in variants for figure, value in {
        "windows_rps": round(rps[name]),
        "ratio_vs_spark_window": round(rps[name] / spark_rps, 3),
        "ratio_vs_flinkish": round(rps[name] / flinkish_rps, 3),
        "peak_state_rows": max(r["peak_state_rows"] for r in runs[name]),
        "worker_peak_rss_mb": max(r["peak_rss_mb"] for r in runs[name]),
        "seconds": [round(r["seconds"], 1) for r in runs[name]],
        "cpu_jvm_python": [[r["jvm_cpu"], r["python_cpu"]] for r in runs[name]],
    }.items()}
    print_result({
        "bench": "windows",
        "records": args.records,
        "keys": args.keys,
        "max_offsets_per_trigger": args.batch,
        "key_groups": args.key_groups or windows.DEFAULT_KEY_GROUPS,
        "repeat": args.repeat,
        "windows_fired": runs[FLINKISH][0]["windows"],
        "flinkish_windows_rps": round(flinkish_rps),
        "spark_window_rps": round(spark_rps),
        "ratio_vs_spark_window": round(flinkish_rps / spark_rps, 3),
        "ratio_target": 0.8,
        "peak_state_rows_flinkish": max(r["peak_state_rows"] for r in runs[FLINKISH]),
        "peak_state_rows_spark": max(r["peak_state_rows"] for r in runs[SPARK]),
        "worker_peak_rss_mb": max(r["peak_rss_mb"] for r in runs[FLINKISH]),
        "flinkish_seconds": [round(r["seconds"], 1) for r in runs[FLINKISH]],
        "spark_seconds": [round(r["seconds"], 1) for r in runs[SPARK]],
        "flinkish_cpu_jvm_python": [[r["jvm_cpu"], r["python_cpu"]] for r in runs[FLINKISH]],
        "spark_cpu_jvm_python": [[r["jvm_cpu"], r["python_cpu"]] for r in runs[SPARK]],
        **others,
    })


if __name__ == "__main__":
    main()
