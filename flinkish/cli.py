"""The ``flinkish`` command; :data:`DESCRIPTION` is what ``flinkish --help`` says about it."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flinkish_sink.target import AnyTarget

#: Plain text (the module docstring is reST): argparse prints it as it is.
DESCRIPTION = (
    "Flink's event-time and exactly-once machinery for Spark Structured Streaming: the demo, "
    "a broker and database for development, and tools to look at a query's checkpoint and "
    "target. Run 'flinkish COMMAND --help' for a command's options."
)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stopped(Exception):
    """Ctrl-C, SIGTERM or SIGHUP arrived: unwind through the clean-up."""


def _stop_on_signal(signum: int, frame: Any) -> None:
    for sig in _STOP_SIGNALS:  # a second signal must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise _Stopped(signum)


def _dev(args: argparse.Namespace) -> int:
    """Start the embedded broker and PostgreSQL, print where they are, keep them until Ctrl-C
    or SIGTERM, then stop both (their data is thrown away)."""
    from flinkish.demo.embedded_kafka import EXTERNAL_ENV, EmbeddedKafka, create_topic
    from flinkish.demo.embedded_postgres import DSN_ENV, EmbeddedPostgres

    topics = []
    for spec in args.topic:
        name, _, count = spec.partition(":")
        if not name or not (count or "1").isdigit() or int(count or "1") < 1:
            raise SystemExit(f"flinkish dev: --topic {spec!r} is not NAME or NAME:PARTITIONS "
                             "(a positive number), e.g. --topic events:4")
        topics.append((name, int(count or "1")))
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _stop_on_signal)
    try:
        with EmbeddedKafka() as kafka, EmbeddedPostgres() as postgres:
            for name, partitions in topics:
                create_topic(kafka.bootstrap_servers, name, partitions)
            print(f"kafka.bootstrap.servers: {kafka.bootstrap_servers}")
            for name, partitions in topics:
                print(f"topic: {name} ({partitions} partition{'s' * (partitions > 1)})")
            print(f"PostgreSQL dsn: {postgres.dsn}")
            print("for your shell (the flinkish tests use these too):")
            print(f"export {EXTERNAL_ENV}={shlex.quote(kafka.bootstrap_servers)} "
                  f"{DSN_ENV}={shlex.quote(postgres.dsn)}")
            print("running; Ctrl-C or SIGTERM stops both (their data is not kept)", flush=True)
            while True:
                signal.pause()
    except _Stopped:
        pass  # the with-block has stopped both
    except RuntimeError as exc:  # no PostgreSQL binaries, no broker binary, a failed start
        raise SystemExit(f"flinkish dev: {exc}") from None
    print("stopped the broker and PostgreSQL", flush=True)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console

    from flinkish import inspect
    from flinkish_sink.target import WATERMARK_SPARK

    try:
        rows = inspect.load_epochs(args.location)
    except inspect.LocationNotFoundError as exc:
        raise SystemExit(f"flinkish inspect: {exc}") from None
    console = Console()
    if not rows:
        console.print(f"no epochs recorded in {args.location}")
        return 1
    rows = inspect.with_source_journal(rows, args.location)
    console.print(inspect.table(rows))
    if any(r.watermark_source == WATERMARK_SPARK for r in rows):
        console.print(inspect.SPARK_EVENT_TIME_NOTE)
    lag = inspect.lags(args.location)
    if lag:
        console.print(inspect.lag_table(lag))
    for batch, names in inspect.held_partitions(args.location).items():
        console.print(f"batch {batch}: watermark alignment held back {', '.join(names)}")
    for batch, names in inspect.capped_partitions(args.location).items():
        console.print(f"batch {batch}: watermark alignment capped {', '.join(names)} "
                      "(read less than their share to stay within the drift)")
    if args.plot:
        read = inspect.reading_batches(args.location)
        inspect.plot(rows, args.plot, lag, read)
        empty = inspect.nothing_to_draw(rows, read)
        console.print(f"plot written to {args.plot}" + (f": {empty}" if empty else ""))
    return 0


def _key_value(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise SystemExit(f"--catalog {text!r}: give KEY=VALUE (a catalog.KEY option's KEY)")
    return key, value


def _open_target(args: argparse.Namespace) -> AnyTarget:
    """The target ``flinkish transactions`` was pointed at (``--<target> LOCATION``), built
    from the sink options the flags stand for."""
    from flinkish_core.errors import OptionError
    from flinkish_sink import targets
    from flinkish_sink.options import TABLE, parse_target_options

    name = next(n for n in targets.names() if getattr(args, f"target_{n}", None))
    factory = targets.factory(name)
    raw = {"target": name, factory.cli_option: getattr(args, f"target_{name}")}
    if args.table:
        raw[TABLE.key] = args.table
    raw.update({f"catalog.{k}": v for k, v in map(_key_value, args.catalog)})
    if args.app_id:
        raw[f"{name}.appId"] = args.app_id
    for option, what in factory.required.items():
        if option is TABLE and not args.table:
            raise SystemExit(f"--{name} needs --table" + (f" ({what})" if what else ""))
    try:
        return factory.create(parse_target_options(raw), False)
    except OptionError as exc:
        raise SystemExit(str(exc)) from None


def _transactions(args: argparse.Namespace) -> int:
    from rich.console import Console

    from checkpointing import CheckpointStorage, CheckpointStore
    from checkpointing.query import query_id, resolve_store
    from flinkish_core.durations import format_duration, parse_duration_ms
    from flinkish_core.errors import OptionError
    from flinkish_sink.two_phase_commit import TwoPhaseCommitCoordinator

    try:
        timeout_s = parse_duration_ms("--transaction-timeout", args.transaction_timeout) / 1000
    except OptionError as exc:
        raise SystemExit(str(exc)) from None

    target = _open_target(args)
    query = args.query or (query_id(args.checkpoint) if args.checkpoint else None)
    if query is None:
        raise SystemExit("name the query: --checkpoint (its checkpointLocation) or --query ID")
    console = Console(soft_wrap=True)  # one line per pre-commit, for grep
    store = None
    if args.checkpoint:
        store = CheckpointStore.reader(CheckpointStorage.open(resolve_store(args.checkpoint)))
    ages = target.pending_ages(args.prefix, query)
    lingering = sorted(ages)
    old = {txn for txn, age in ages.items() if age is not None and age > timeout_s}
    for txn in sorted(lingering, key=lambda t: -(ages[t] or 0.0)):  # oldest first
        age = ages[txn]
        since = "age unknown" if age is None else f"prepared {format_duration(age)} ago"
        console.print(
            f"lingering pre-commit {txn.gid} (epoch {txn.epoch}, task {txn.task}, attempt "
            f"{txn.attempt}), {since}"
            + (f" [bold red]older than {format_duration(timeout_s)}[/]" if txn in old else ""),
            highlight=False)
    if old:
        console.print(
            "pre-commits older than the transaction timeout hold locks (and, in PostgreSQL, "
            "keep VACUUM from cleaning up): restart the query, or stop it and run this "
            "command with --resolve")
    if not lingering:
        console.print(f"no lingering pre-commits for prefix {args.prefix!r}, query {query}")
    if args.resolve and lingering:
        if store is None:
            raise SystemExit("--resolve needs --checkpoint: decisions are read from there")
        coordinator = TwoPhaseCommitCoordinator(store, target, args.prefix, query)
        committed, rolled = coordinator.recover()
        for gid in committed:
            console.print(f"resolved {gid}: committed (its epoch decided on it)")
        for gid in rolled:
            console.print(f"resolved {gid}: rolled back (no decision names it)")
    target.close()
    return 0


def _target_flags(txns: argparse.ArgumentParser) -> None:
    """``--<target> LOCATION`` for each target, and the flags of the options some take."""
    from flinkish_sink import targets

    where = txns.add_mutually_exclusive_group(required=True)
    installed = targets.installed()
    for factory in installed:
        where.add_argument(f"--{factory.name}", dest=f"target_{factory.name}",
                           metavar=factory.cli_option.upper().replace(".", "_"),
                           help=f"the sink's {factory.title} target: its {factory.cli_option} "
                           "option")

    def flags(names: list[str]) -> str:
        return targets.listed([f"--{n}" for n in names], "or")

    def taking(key: str) -> list[str]:
        return [f.name for f in installed if any(o.key == key for o in f.options)]

    txns.add_argument("--table", help=f"with {flags(taking('table'))}: the sink's table "
                      "option")
    txns.add_argument("--catalog", action="append", default=[], metavar="KEY=VALUE",
                      help=f"with {flags(taking('catalog.*'))}: another catalog.KEY option of "
                      "the sink (name, warehouse …); repeatable")
    app_ids = [n for n in targets.names() if n in taking(f"{n}.appId")]
    txns.add_argument("--app-id", dest="app_id",
                      help=f"with {flags(app_ids)}: the sink's "
                      f"{' / '.join(f'{n}.appId' for n in app_ids)} option, if it was set")


def build_parser() -> argparse.ArgumentParser:
    """The command line; the docs site's CLI reference prints each command's help from it."""
    parser = argparse.ArgumentParser(prog="flinkish", description=DESCRIPTION)
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND",
                                     required=True)

    demo = commands.add_parser("demo", help="run the end-to-end demo on an embedded broker",
                               description="The main job: a lagging and a silent partition, "
                               "a crash, exactly-once output and windows counted on the "
                               "combined watermark against Spark's own, shown live.")
    demo.add_argument("--duration", type=float, default=60.0, metavar="SECONDS",
                      help="produce events for this long, at most, counted from when Spark "
                      "is up (default 60: enough for every phase on 2 busy cores); the demo "
                      "then catches up and verifies")
    demo.add_argument("--target", choices=("parquet", "postgres"), default="parquet",
                      help="where the sink writes: parquet (files in the work directory) or "
                      "postgres (an embedded PostgreSQL) (default parquet)")
    demo.add_argument("--bootstrap", help="use this Kafka cluster instead of the embedded broker")
    demo.add_argument("--plain", action="store_true", help="no live display (logs only)")
    demo.add_argument("--workdir", help="keep the checkpoint and output here (default: a temp "
                      "directory, removed at the end)")

    dev = commands.add_parser(
        "dev", help="start an embedded Kafka broker and PostgreSQL for your own code",
        description="Starts the embedded Kafka-protocol broker and a throw-away PostgreSQL "
        "(two-phase commit enabled) on loopback, prints the bootstrap servers, the DSN and a "
        "shell line exporting both, and keeps them running until Ctrl-C or SIGTERM. Nothing "
        "is kept after they stop.")
    dev.add_argument("--topic", action="append", default=[], metavar="NAME[:PARTITIONS]",
                     help="create this topic (default 1 partition); repeatable")

    inspect = commands.add_parser("inspect", help="show a query's epochs and watermarks")
    inspect.add_argument("location", help="the query's checkpointLocation, or its store")
    inspect.add_argument("--plot", metavar="FILE.png", help="also plot watermarks over epochs")

    txns = commands.add_parser("transactions",
                               help="list or resolve pre-commits a query left in its target")
    from flinkish_core.durations import format_duration
    from flinkish_sink.options import TRANSACTION_TIMEOUT, TRANSACTIONAL_ID_PREFIX

    _target_flags(txns)
    txns.add_argument("--prefix", default=TRANSACTIONAL_ID_PREFIX.default,
                      help=f"the sink's {TRANSACTIONAL_ID_PREFIX.key} (default "
                      f"{TRANSACTIONAL_ID_PREFIX.default})")
    txns.add_argument("--query", help="query id (default: read from --checkpoint)")
    txns.add_argument("--checkpoint", help="the query's checkpointLocation")
    txns.add_argument("--resolve", action="store_true",
                      help="commit decided pre-commits, roll back the rest (stop the query first)")
    timeout = format_duration(TRANSACTION_TIMEOUT.default / 1000)
    txns.add_argument("--transaction-timeout", default=timeout, metavar="DURATION",
                      help=f"flag pre-commits older than this (default: {timeout}, the sink's "
                      f"{TRANSACTION_TIMEOUT.key} default)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from flinkish.demo.main import run_demo

        return run_demo(duration=args.duration, target=args.target, bootstrap=args.bootstrap,
                        live=not args.plain, workdir=args.workdir)
    return {"dev": _dev, "inspect": _inspect, "transactions": _transactions}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
