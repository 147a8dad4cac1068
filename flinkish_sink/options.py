"""The sink's options, validated when the query starts (in ``streamWriter``)."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum

from flinkish_core.durations import parse_duration_ms
from flinkish_core.errors import OptionError
from flinkish_core.locations import MASTER_ENV, local_location_problem
from flinkish_core.secrets import (
    dsn_secrets,
    fingerprint,
    mask_dsn,
    mask_uri,
    redact_config,
    secret_values,
)


class DeliveryGuarantee(Enum):
    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"
    NONE = "none"


class LateData(Enum):
    KEEP = "keep"
    DROP = "drop"
    SIDE = "side"


#: The options as the documentation spells them. Spark lower-cases option keys before the sink
#: sees them, so lookups go through the lower-case form and messages use this spelling.
_NAMES = (
    "target", "dsn", "table", "path", "checkpointing.location", "checkpointing.retain",
    "checkpointLocation", "deliveryGuarantee", "lateData", "lateData.table", "lateData.path",
    "eventTimeColumn", "transactionalIdPrefix", "epochsTable", "transactionTimeout",
    "outageTimeout",
    "upsertKey", "partitionBy", "delta.appId", "delta.compactEvery", "delta.vacuumRetention",
    "parquet.compactEvery", "parquet.targetFileSize",
    "iceberg.appId", "catalog.uri", "catalog.warehouse", "catalog.name",
    "queryName",  # Spark passes writeStream.queryName(...) to the sink's options
)
_KNOWN = {name.lower(): name for name in _NAMES}
#: Options passed on to the Iceberg catalog (``catalog.uri`` -> its property ``uri``).
CATALOG_PREFIX = "catalog."
_PREFIX = re.compile(r"^[A-Za-z0-9_.]+$")
DEFAULT_TRANSACTION_TIMEOUT_MS = 15 * 60_000
#: How long the sink rides out an unreachable target (see :mod:`flinkish_sink.outages`): a
#: database's restart or an object store's failover, not a lasting loss.
DEFAULT_OUTAGE_TIMEOUT_MS = 30_000
#: Epochs between compactions of a Delta table: with a few write tasks an epoch adds a few
#: small files, so a partition holds at most a few hundred before they are rewritten.
DEFAULT_COMPACT_EVERY = 50
#: Epochs between compactions of a Parquet target's files; off unless asked for: a reader that
#: lists the directory sees a compaction's rows twice for a moment (docs/guides/exactly-once.md)
DEFAULT_PARQUET_COMPACT_EVERY = 0
#: The size Parquet compaction merges files up to (Spark's Delta ``OPTIMIZE`` aims at 1 GB,
#: Iceberg at 512 MB; a stream's files are read as they come, so smaller).
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
_HOUR_MS = 3_600_000
_SIZE = re.compile(r"^(\d+)\s*([kmgt]?)i?b?$")


@dataclass(frozen=True, repr=False)
class SinkOptions:
    """The parsed options. ``dsn`` may hold a password: the repr masks it, and
    :attr:`fingerprint` (not the repr) is what identifies a configuration in caches."""

    target: str
    dsn: str | None
    table: str | None
    path: str | None
    checkpoint_location: str | None
    state_location: str | None
    retain: int
    guarantee: DeliveryGuarantee
    late_data: LateData
    late_table: str | None
    late_path: str | None
    event_time_column: str
    prefix: str
    epochs_table: str | None
    #: how old one of the sink's own pre-commits may get before the sink warns about it
    #: (Flink's transactionTimeout warning): prepared transactions hold locks and keep
    #: PostgreSQL's VACUUM from cleaning up
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    #: how long a step that fails because the target is unreachable is retried before the
    #: query fails (0: not retried)
    outage_timeout_ms: int = DEFAULT_OUTAGE_TIMEOUT_MS
    #: the table's columns on which a row replaces the row of the same key (PostgreSQL, Delta)
    upsert_key: tuple[str, ...] = ()
    #: the partition columns of a Delta or Iceberg table the sink creates (empty: the table's
    #: own)
    partition_by: tuple[str, ...] = ()
    #: the app id of a Delta table's ``txn`` actions or an Iceberg table's snapshot summaries
    #: (None: the query's id)
    app_id: str | None = None
    #: the Iceberg catalog's properties (the ``catalog.*`` options without the prefix)
    catalog: tuple[tuple[str, str], ...] = ()
    #: compact a Delta table's small files after every that many epochs (0: never)
    compact_every: int = DEFAULT_COMPACT_EVERY
    #: after compacting, vacuum files a Delta table stopped referencing this long ago (hours;
    #: None: never)
    vacuum_retention_hours: int | None = None
    #: merge a Parquet target's small committed files after every that many epochs (0: never)
    parquet_compact_every: int = DEFAULT_PARQUET_COMPACT_EVERY
    #: the size (bytes) a Parquet compaction merges files up to
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE

    def __repr__(self) -> str:
        masked = {
            "dsn": mask_dsn(self.dsn), "path": mask_uri(self.path),
            "checkpoint_location": mask_uri(self.checkpoint_location),
            "state_location": mask_uri(self.state_location), "late_path": mask_uri(self.late_path),
            "catalog": tuple((k, mask_uri(v) if k == "uri" else v)
                             for k, v in redact_config(dict(self.catalog)).items()),
        }
        shown = ", ".join(
            f"{f.name}={masked.get(f.name, getattr(self, f.name))!r}" for f in fields(self)
        )
        return f"SinkOptions({shown})"

    @property
    def fingerprint(self) -> str:
        """A hash of every option, secrets included: equal options, equal fingerprints."""
        return fingerprint(*(getattr(self, f.name) for f in fields(self)))

    @property
    def secrets(self) -> list[str]:
        """The secret values in the options (the DSN's password), to scrub from messages."""
        catalog = dict(self.catalog)
        return (dsn_secrets(self.dsn) + dsn_secrets(catalog.get("uri"))
                + secret_values(catalog))


def _choice(options: Mapping[str, str], key: str, name: str, enum: type[Enum], default: Enum
            ) -> Enum:
    raw = options.get(key)
    if raw is None:
        return default
    for member in enum:
        if member.value == raw.strip().lower():
            return member
    accepted = ", ".join(str(m.value) for m in enum)
    raise OptionError(f"option {name}: {raw!r} is not one of {accepted}")


def parse_sink_options(raw: Mapping[str, str]) -> SinkOptions:
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = sorted(k for k in options if k not in _KNOWN and not k.startswith(CATALOG_PREFIX))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(_KNOWN), n=1)
        hint = f"; did you mean {_KNOWN[close[0]]}?" if close else ""
        raise OptionError(f"unknown option {unknown[0]!r} for the flinkish sink{hint}")
    target = options.get("target", "").strip().lower()
    if target not in ("postgres", "parquet", "delta", "iceberg"):
        raise OptionError(
            f"option target: {options.get('target')!r} is not postgres, parquet, delta or "
            "iceberg (where the sink writes)"
        )
    catalog = tuple(sorted((k[len(CATALOG_PREFIX):], v) for k, v in options.items()
                           if k.startswith(CATALOG_PREFIX)))
    if catalog and target != "iceberg":
        raise OptionError(f"options catalog.* apply to target iceberg only (not {target})")
    if target == "iceberg":
        if not options.get("table"):
            raise OptionError(
                "option table is required with target iceberg (namespace.table, e.g. "
                "'events.clicks')")
        if not dict(catalog).get("uri"):
            raise OptionError(
                "option catalog.uri is required with target iceberg: the catalog's database "
                "(sqlite:///path/catalog.db, postgresql+psycopg://user@host/db) or a REST "
                "catalog's http(s):// URI")
        if "path" in options or "dsn" in options:
            raise OptionError(
                "options path/dsn do not apply to target iceberg: it takes table and "
                "catalog.* (the table's files go where the catalog puts the table)")
    elif target == "postgres":
        for key in ("dsn", "table"):
            if not options.get(key):
                raise OptionError(f"option {key} is required with target postgres")
        if "path" in options:
            raise OptionError(
                "option path applies to targets parquet and delta; postgres takes dsn/table")
    elif not options.get("path"):
        raise OptionError(
            f"option path is required with target {target} (a directory or URI)")
    elif "table" in options or "dsn" in options:
        raise OptionError(f"options dsn/table apply to target postgres; {target} takes path")
    if "partitionby" in options and target not in ("delta", "iceberg"):
        raise OptionError("option partitionBy applies to targets delta and iceberg only")
    for key, name, only in (("delta.appid", "delta.appId", "delta"),
                            ("delta.compactevery", "delta.compactEvery", "delta"),
                            ("delta.vacuumretention", "delta.vacuumRetention", "delta"),
                            ("iceberg.appid", "iceberg.appId", "iceberg"),
                            ("parquet.compactevery", "parquet.compactEvery", "parquet"),
                            ("parquet.targetfilesize", "parquet.targetFileSize", "parquet")):
        if key in options and target != only:
            raise OptionError(f"option {name} applies to target {only} only")
    compact_every = _epochs(options, "delta.compactEvery", DEFAULT_COMPACT_EVERY)
    parquet_compact_every = _epochs(options, "parquet.compactEvery",
                                    DEFAULT_PARQUET_COMPACT_EVERY)
    target_file_size = DEFAULT_TARGET_FILE_SIZE
    if "parquet.targetfilesize" in options:
        target_file_size = parse_size("parquet.targetFileSize", options["parquet.targetfilesize"])
    vacuum_hours = None
    if "delta.vacuumretention" in options:
        retention_ms = parse_duration_ms("delta.vacuumRetention", options["delta.vacuumretention"])
        if retention_ms < _HOUR_MS:
            raise OptionError(
                f"option delta.vacuumRetention: {options['delta.vacuumretention']!r} is under "
                "an hour; it must be longer than the query can ever be down (files of an epoch "
                "not yet committed would be deleted), e.g. '7 days'")
        vacuum_hours = -(-retention_ms // _HOUR_MS)
    partition_by = tuple(
        c.strip() for c in options.get("partitionby", "").split(",") if c.strip())
    app_key = "iceberg.appid" if target == "iceberg" else "delta.appid"
    app_id = options.get(app_key, "").strip() or None
    if app_key in options and app_id is None:
        raise OptionError(
            f"option {_KNOWN[app_key]} is empty: leave it out to use the query's id, or name "
            "the app id the table's commits record")

    guarantee = _choice(options, "deliveryguarantee", "deliveryGuarantee", DeliveryGuarantee,
                        DeliveryGuarantee.EXACTLY_ONCE)
    late = _choice(options, "latedata", "lateData", LateData, LateData.KEEP)
    late_table = options.get("latedata.table") or None
    late_path = options.get("latedata.path") or None
    if late is LateData.SIDE:
        if target in ("postgres", "iceberg") and not late_table:
            raise OptionError(
                f"lateData=side with target {target} needs option lateData.table")
        if target == "iceberg" and late_table == options.get("table"):
            raise OptionError("option lateData.table must name another table than table")
        if target in ("parquet", "delta") and not late_path:
            raise OptionError(f"lateData=side with target {target} needs option lateData.path")
        if target in ("parquet", "delta") and late_path == options.get("path"):
            raise OptionError("option lateData.path must name another place than path")
    elif late_table or late_path:
        raise OptionError("options lateData.table / lateData.path apply only with lateData=side")

    if guarantee is DeliveryGuarantee.NONE and late is not LateData.KEEP:
        raise OptionError(
            "option lateData: judging late rows needs the epoch bookkeeping that "
            "deliveryGuarantee=none turns off; use at-least-once or exactly-once"
        )
    retain_text = options.get("checkpointing.retain", "100").strip()
    if not retain_text.isdigit() or int(retain_text) < 1:
        raise OptionError(
            f"option checkpointing.retain: {retain_text!r} is not a whole number >= 1"
        )
    prefix = options.get("transactionalidprefix", "flinkish").strip()
    if not _PREFIX.match(prefix):
        raise OptionError(
            f"option transactionalIdPrefix: {prefix!r} may only hold letters, digits, '_' and '.'"
        )
    timeout_ms = DEFAULT_TRANSACTION_TIMEOUT_MS
    if "transactiontimeout" in options:
        timeout_ms = parse_duration_ms("transactionTimeout", options["transactiontimeout"])
        if timeout_ms <= 0:
            raise OptionError(
                f"option transactionTimeout: {options['transactiontimeout']!r} must be a "
                "positive duration (how old a lingering pre-commit may get before the sink "
                "warns), e.g. '15 min'"
            )
    outage_ms = DEFAULT_OUTAGE_TIMEOUT_MS
    if "outagetimeout" in options:
        outage_ms = parse_duration_ms("outageTimeout", options["outagetimeout"])
    upsert_key = tuple(c.strip() for c in options.get("upsertkey", "").split(",") if c.strip())
    if "upsertkey" in options and (target in ("parquet", "iceberg") or not upsert_key):
        raise OptionError(
            "option upsertKey: the key columns, comma-separated (e.g. 'k,window_start'), with "
            "target postgres or delta (Parquet files only append: a window's rows carry its "
            "pane, whose highest index is the latest)"
        )
    # Parquet files are staged by the write tasks and moved into place by the driver, Delta
    # data files written by the tasks and committed by the driver (the store, by contrast, is
    # the driver's alone)
    for key, given in (("path", options.get("path")), ("lateData.path", late_path)):
        problem = given and local_location_problem(
            key, given, os.environ.get(MASTER_ENV),
            "write tasks on the executors write files there and the driver commits them")
        if problem:
            raise OptionError(problem)
    checkpoint = options.get("checkpointlocation") or None
    state = options.get("checkpointing.location") or None
    if guarantee is not DeliveryGuarantee.NONE and not (checkpoint or state):
        raise OptionError(
            "the flinkish sink needs the query's checkpointLocation (or option "
            "checkpointing.location) to keep its per-epoch commit records"
        )
    return SinkOptions(
        target=target,
        dsn=options.get("dsn"),
        table=options.get("table"),
        path=options.get("path"),
        checkpoint_location=checkpoint,
        state_location=state,
        retain=int(retain_text),
        guarantee=guarantee,  # type: ignore[arg-type]
        late_data=late,  # type: ignore[arg-type]
        late_table=late_table,
        late_path=late_path,
        event_time_column=options.get("eventtimecolumn", "eventTime"),
        prefix=prefix,
        epochs_table=options.get("epochstable") or None,
        transaction_timeout_ms=timeout_ms,
        outage_timeout_ms=outage_ms,
        upsert_key=upsert_key,
        partition_by=partition_by,
        app_id=app_id,
        catalog=catalog,
        compact_every=compact_every,
        vacuum_retention_hours=vacuum_hours,
        parquet_compact_every=parquet_compact_every,
        target_file_size=target_file_size,
    )


def _epochs(options: Mapping[str, str], name: str, default: int) -> int:
    text = options.get(name.lower(), str(default)).strip()
    if not text.isdigit():
        raise OptionError(
            f"option {name}: {text!r} is not a whole number of epochs (0: never compact)")
    return int(text)


def parse_size(name: str, text: str) -> int:
    """Bytes from ``text``: a whole number with an optional unit (``128 MB``, ``64MiB``,
    ``1 GB``: powers of 1024), for option ``name``."""
    match = _SIZE.match(text.strip().lower())
    if not match or int(match[1]) < 1:
        raise OptionError(
            f"option {name}: {text!r} is not a positive size, e.g. '128 MB' or '1 GB'")
    return int(match[1]) * 1024 ** " kmgt".index(match[2] or " ")
