"""The sink's options, validated when the query starts (in ``streamWriter``).

The sink's own options and those several targets take are declared here, each target's in its
module; the docs' sink option reference is generated from the declarations.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, TypeVar

from flinkish_core.config import (
    Option,
    checked,
    choice,
    did_you_mean,
    duration_ms,
    match,
    names,
    optional_text,
    reference_table,
    text,
    whole_number,
)
from flinkish_core.errors import OptionError
from flinkish_core.locations import MASTER_ENV, local_location_problem
from flinkish_core.secrets import fingerprint, mask_uri
from flinkish_sink import targets

T = TypeVar("T")


class DeliveryGuarantee(Enum):
    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"
    NONE = "none"


class LateData(Enum):
    KEEP = "keep"
    DROP = "drop"
    SIDE = "side"


SINK = "sink"
DEFAULT_TRANSACTION_TIMEOUT_MS = 15 * 60_000
#: Long enough for a database's restart or an object store's failover, not a lasting loss.
DEFAULT_OUTAGE_TIMEOUT_MS = 30_000
_PREFIX = re.compile(r"^[A-Za-z0-9_.]+$")


def _prefix_chars(key: str, value: str, prefix: str) -> None:
    if not _PREFIX.match(prefix):
        raise OptionError(
            f"option {key}: {prefix!r} may only hold letters, digits, '_' and '.'")


def _positive(key: str, value: str, ms: int) -> None:
    if ms <= 0:
        raise OptionError(
            f"option {key}: {value!r} must be a positive duration (how old a lingering "
            "pre-commit may get before the sink warns), e.g. '15 min'")


def _shared_location(key: str, value: str, location: str | None) -> None:
    """Files staged in the tasks and committed on the driver must be where both reach."""
    problem = location and local_location_problem(
        key, location, os.environ.get(MASTER_ENV),
        "write tasks on the executors write files there and the driver commits them")
    if problem:
        raise OptionError(problem)


def _upsert_key(key: str, value: str, columns: tuple[str, ...]) -> None:
    if not columns:
        raise _upsert_key_error()


def _upsert_key_error() -> OptionError:
    return OptionError(
        "option upsertKey: the key columns, comma-separated (e.g. 'k,window_start'), with "
        f"target {targets.listed(targets.taking(UPSERT_KEY), 'or')}")


def _app_id(key: str, value: str) -> str:
    if not value.strip():
        raise OptionError(
            f"option {key} is empty: leave it out to use the query's id, or name the app id "
            "the table's commits record")
    return value.strip()


def app_id_option(key: str, where: str) -> Option[str | None]:
    """A Delta or Iceberg target's option of its app id (``where`` it is recorded)."""
    return Option(key, _app_id, None, shown_default="the query's id",
                  doc=f"The app id {where}; the query's id is kept in `checkpointLocation`, "
                      "stable across restarts and different per query.")


# The sink's own options.
TARGET: Option[str] = Option(
    "target", text, "", owner=SINK, shown_default="required",
    doc="Where the sink writes: one of the targets below ([Delta Lake](../delta.md), "
        "[Apache Iceberg](../iceberg.md), [Kafka](../guides/exactly-once-kafka.md)).")
DELIVERY_GUARANTEE = Option(
    "deliveryGuarantee", choice(DeliveryGuarantee), DeliveryGuarantee.EXACTLY_ONCE, owner=SINK,
    doc="`exactly-once`: prepare in tasks, commit on the driver. `at-least-once`: tasks write "
        "directly; epochs, the valve and late rows are still recorded (delta: every batch of "
        "rows a task writes becomes a table version of its own, without `txn`, so a replay "
        "writes them again; many small versions). `none`: tasks write directly; nothing is "
        "recorded, so there is no combined watermark and no late detection.")
LATE_DATA = Option(
    "lateData", choice(LateData), LateData.KEEP, owner=SINK,
    doc="`keep`, `drop` or `side`: what happens to record rows whose `eventTimeColumn` ≤ the "
        "combined watermark after the previous epoch, and to `flinkish.windows`' `late` rows "
        "(judged by the operator). They are counted in every mode. With `upsertKey`, the "
        "operator's late rows (no window) need `side` or `drop`. With `side` or `drop`, the "
        "operator's results go to a table without the late rows' own columns (event time, "
        "value), and with `side` its late rows to one without the window and pane columns.")
EVENT_TIME_COLUMN = Option(
    "eventTimeColumn", text, "eventTime", owner=SINK,
    doc="Timestamp column used to classify late rows (another type fails at start). If the "
        "stream has no such column, no row is late.")
TRANSACTIONAL_ID_PREFIX = Option(
    "transactionalIdPrefix", checked(lambda k, v: v.strip(), _prefix_chars), "flinkish",
    owner=SINK,
    doc="Letters, digits, `_`, `.`. Transaction ids are `<prefix>:<query id>:<epoch>:<task>:"
        "<attempt>:<run token>` (Kafka's transactional ids: without the run token). The side "
        "output uses `<prefix>-late`.")
CHECKPOINT_LOCATION = Option(
    "checkpointLocation", optional_text, None, owner=SINK, shown_default="Spark's",
    mask=mask_uri,
    doc="The query's checkpoint. The sink reads the query id from its `metadata` file. "
        "Required unless `deliveryGuarantee=none`.")
STATE_LOCATION = Option(
    "checkpointing.location", optional_text, None, owner=SINK,
    shown_default="`<checkpointLocation>/flinkish`", mask=mask_uri,
    doc="The sink's checkpoint store (decision records, combined watermarks).")
RETAIN = Option(
    "checkpointing.retain", whole_number(1, "a whole number >= 1"), 100, owner=SINK,
    doc="Completed epochs kept in the store (≥ 1).")
TRANSACTION_TIMEOUT = Option(
    "transactionTimeout", checked(duration_ms, _positive), DEFAULT_TRANSACTION_TIMEOUT_MS,
    owner=SINK, shown_default="`15 min`",
    doc="Duration. The sink logs a warning when it finds one of its own pre-commits older "
        "than this (Flink's `transactionTimeout` warning): a prepared PostgreSQL transaction "
        "holds locks and blocks `VACUUM` until it is resolved. `flinkish transactions` shows "
        "each one's age. Kafka: the broker itself aborts a transaction open longer than "
        "`kafka.transaction.timeout.ms` (see [the transaction timeout]"
        "(../guides/exactly-once-kafka.md#the-transaction-timeout)).")
OUTAGE_TIMEOUT = Option(
    "outageTimeout", duration_ms, DEFAULT_OUTAGE_TIMEOUT_MS, owner=SINK, shown_default="`30 s`",
    doc="Duration. How long the sink retries a step that failed because its target could not "
        "be reached (a database restarting, an object store away), with backoff, in the write "
        "tasks and on the driver, before the query fails with an error naming the target; "
        "`0`: fail at the first error. Never duplicates a row: see [when the target is away]"
        "(../guides/recover-after-crash.md#when-the-target-is-away-for-a-while).")
QUERY_NAME = Option(
    "queryName", optional_text, None, owner=SINK, shown_default="Spark's",
    doc="Set by `writeStream.queryName(...)`, which Spark passes to the sink as an option; "
        "accepted and not used.")
SINK_OPTIONS: tuple[Option[Any], ...] = (
    TARGET, DELIVERY_GUARANTEE, LATE_DATA, EVENT_TIME_COLUMN, TRANSACTIONAL_ID_PREFIX,
    CHECKPOINT_LOCATION, STATE_LOCATION, RETAIN, TRANSACTION_TIMEOUT, OUTAGE_TIMEOUT, QUERY_NAME,
)

# Options several targets take (each target lists those it takes).
PATH = Option(
    "path", checked(optional_text, _shared_location), None, mask=mask_uri,
    doc="Directory or `pyarrow.fs` URI (`.start(path)` also sets it); for delta the table: a "
        "local directory (single machine only) or a URI (`s3://…`).")
TABLE = Option(
    "table", optional_text, None,
    doc="Iceberg: `namespace.table` in the catalog, created (with its namespace) from the "
        "stream's schema if missing, windows split as below; otherwise its columns and "
        "identity partitioning are checked. PostgreSQL: `table` or `schema.table`. Created "
        "from the stream's schema if missing; otherwise its columns are checked. A Spark time "
        "window (`window`, `session_window`: `struct<start, end>` of timestamps) becomes two "
        "`timestamptz` columns `<name>_start` and `<name>_end` (a table flinkish 0.1 "
        "created with a jsonb `<name>` column is refused with the statements that move it). "
        "Other structs, arrays and maps are stored as `jsonb`.")
UPSERT_KEY: Option[tuple[str, ...]] = Option(
    "upsertKey", checked(names, _upsert_key), (),
    doc="Comma-separated table columns (a window `w` is `w_start`, `w_end`). A row replaces "
        "the table's row with the same key, inside the same prepared transaction; a new table "
        "gets it as primary key, an existing one needs a unique index on exactly these "
        "columns. Late-data side tables still append.")
PARTITION_BY: Option[tuple[str, ...]] = Option(
    "partitionBy", names, (), shown_default="the table's",
    doc="Comma-separated partition columns (identity partitions) of a table the sink creates "
        "(strings, integers, booleans, dates, timestamps; a window `w` is `w_start`, `w_end`); "
        "an existing table's must match.")
LATE_TABLE = Option(
    "lateData.table", optional_text, None,
    doc="With `lateData=side`: the side-output table (iceberg: `namespace.table` in the same "
        "catalog).")
LATE_PATH = Option(
    "lateData.path", checked(optional_text, _shared_location), None, mask=mask_uri,
    doc="With `lateData=side`: the side-output directory or table.")


def distinct(options: TargetOptions, main: Option[Any], what: str) -> None:
    """Raise OptionError if the side output is ``main`` itself (another ``what``)."""
    side = LATE_TABLE if main is TABLE else LATE_PATH
    if options[side] is not None and options[side] == options[main]:
        raise OptionError(f"option {side.key} must name another {what} than {main.key}")


@dataclass(frozen=True, repr=False)
class TargetOptions:
    """A target's name, the sink options it reads, and the values of the options it
    declares, by key (given or default); ``options[OPTION]`` reads one."""

    name: str
    values: tuple[tuple[str, Any], ...] = ()
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE
    late_data: LateData = LateData.KEEP

    def __getitem__(self, option: Option[T]) -> T:
        return dict(self.values).get(option.key, option.default)

    def __repr__(self) -> str:
        declared = {o.key: o for o in targets.factory(self.name).options}
        shown = ", ".join(
            f"{key}={_masked(declared.get(key), value)!r}" for key, value in self.values)
        return f"TargetOptions({self.name}, {shown})"

    @property
    def secrets(self) -> list[str]:
        """The secret values among the options, to scrub from messages."""
        return [secret for option in targets.factory(self.name).options
                if option.secrets is not None for secret in option.secrets(self[option])]


def _masked(option: Option[Any] | None, value: Any) -> Any:
    return option.mask(value) if option is not None and option.mask and value else value


@dataclass(frozen=True, repr=False)
class SinkOptions:
    """The parsed options; the repr masks passwords, :attr:`fingerprint` identifies them in
    caches; ``options[OPTION]`` reads one of the target's."""

    target_options: TargetOptions
    checkpoint_location: str | None
    state_location: str | None
    retain: int
    event_time_column: str
    prefix: str
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    outage_timeout_ms: int = DEFAULT_OUTAGE_TIMEOUT_MS

    @property
    def target(self) -> str:
        return self.target_options.name

    @property
    def guarantee(self) -> DeliveryGuarantee:
        return self.target_options.guarantee

    @property
    def late_data(self) -> LateData:
        return self.target_options.late_data

    def __getitem__(self, option: Option[T]) -> T:
        return self.target_options[option]

    def __repr__(self) -> str:
        masked = {"checkpoint_location": mask_uri(self.checkpoint_location),
                  "state_location": mask_uri(self.state_location)}
        shown = ", ".join(
            f"{f.name}={masked.get(f.name, getattr(self, f.name))!r}" for f in fields(self))
        return f"SinkOptions({shown})"

    @property
    def fingerprint(self) -> str:
        """A hash of every option, secrets included: equal options, equal fingerprints."""
        target = self.target_options
        return fingerprint(target.name, target.values, target.guarantee, target.late_data,
                           *(getattr(self, f.name) for f in fields(self)[1:]))

    @property
    def secrets(self) -> list[str]:
        return self.target_options.secrets


def _unknown(key: str, declared: Mapping[str, Option[Any]], target: str) -> OptionError:
    """The error for option ``key``, undeclared by ``target``: where it applies, or the
    option it is closest to."""
    everything = dict(declared)
    for other in targets.installed():
        for option in other.options:
            everything.update({s: option for s in option.spellings()})
            if option.prefix is not None and key.startswith(option.prefix.lower()) or (
                    key in option.spellings()):
                return _misplaced(option, target)
    return OptionError(f"unknown option {key!r} for the flinkish sink"
                       f"{did_you_mean(key, everything)}")


def _misplaced(option: Option[Any], target: str) -> OptionError:
    takers = targets.taking(option)
    if option is UPSERT_KEY:
        return _upsert_key_error()
    many = option.prefix is not None
    return OptionError(
        f"option{'s' if many else ''} {option.key} appl{'y' if many else 'ies'} to "
        f"target{'s' if len(takers) > 1 else ''} {targets.listed(takers, 'and')} only "
        f"(not {target})")


def parse_target_options(raw: Mapping[str, Any]) -> TargetOptions:
    """The options of the target ``raw`` names, checked against its declarations.

    Raises:
        OptionError: an unknown, misplaced, missing or wrong option.
    """
    given_target = next((str(v) for k, v in raw.items() if str(k).lower() == "target"), None)
    name = (given_target or "").strip().lower()
    if name not in targets.names():
        raise OptionError(
            f"option target: {given_target!r} is not {targets.listed(targets.names(), 'or')} "
            "(where the sink writes)")
    factory = targets.factory(name)
    given = match(raw, (*SINK_OPTIONS, *factory.options),
                  lambda key, declared: _unknown(key, declared, name))
    for option, what in factory.required.items():
        if not given.value(option):
            raise OptionError(f"option {option.key} is required with target {name}"
                              + (f" ({what})" if what else ""))
    options = TargetOptions(
        name, tuple((o.key, given.value(o)) for o in factory.options),
        given.value(DELIVERY_GUARANTEE), given.value(LATE_DATA))
    side = factory.side_output
    if options.late_data is LateData.SIDE:
        if side is None:
            raise OptionError(f"lateData=side: target {name} has no side output; use "
                              "lateData=keep or drop")
        if not options[side]:
            raise OptionError(f"lateData=side with target {name} needs option {side.key}")
    elif side is not None and side in given:
        raise OptionError("options lateData.table / lateData.path apply only with lateData=side")
    factory.check(options)
    return options


def parse_sink_options(raw: Mapping[str, Any]) -> SinkOptions:
    """The sink's options from the ones a query gave (Spark hands them over lower-cased).

    Raises:
        OptionError: an unknown, misplaced, missing or wrong option, with the fix.
    """
    target = parse_target_options(raw)
    own = {s for o in SINK_OPTIONS for s in o.spellings()}
    given = match({k: v for k, v in raw.items() if str(k).lower() in own}, SINK_OPTIONS,
                  lambda key, declared: OptionError(f"unknown option {key!r}"))
    if target.guarantee is DeliveryGuarantee.NONE and target.late_data is not LateData.KEEP:
        raise OptionError(
            "option lateData: judging late rows needs the epoch bookkeeping that "
            "deliveryGuarantee=none turns off; use at-least-once or exactly-once")
    checkpoint = given.value(CHECKPOINT_LOCATION)
    state = given.value(STATE_LOCATION)
    if target.guarantee is not DeliveryGuarantee.NONE and not (checkpoint or state):
        raise OptionError(
            "the flinkish sink needs the query's checkpointLocation (or option "
            "checkpointing.location) to keep its per-epoch commit records")
    return SinkOptions(
        target_options=target, checkpoint_location=checkpoint, state_location=state,
        retain=given.value(RETAIN), event_time_column=given.value(EVENT_TIME_COLUMN),
        prefix=given.value(TRANSACTIONAL_ID_PREFIX),
        transaction_timeout_ms=given.value(TRANSACTION_TIMEOUT),
        outage_timeout_ms=given.value(OUTAGE_TIMEOUT))


def reference() -> str:
    """The docs' sink option reference (Markdown), generated from the declarations."""
    factories = targets.installed()
    target_options = list({o: None for f in factories for o in f.options})
    listing = "\n".join(f"- `{f.name}`: {f.doc}" for f in factories)

    def where(option: Option[Any]) -> str:
        return ", ".join(f"`{f.name}`" for f in factories if option in f.options)

    def required(option: Option[Any]) -> str:
        names = [f.name for f in factories if option in f.required]
        return f"for {targets.listed(names, 'and')}" if names else ""

    return (f"{reference_table(SINK_OPTIONS)}\n## Targets\n\n{listing}\n\n"
            "Each target takes these options:\n\n"
            f"{reference_table(target_options, where, required)}")
