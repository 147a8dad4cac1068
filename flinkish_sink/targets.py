"""The sink's targets, found by name (option ``target``), as Flink finds its connector factories.

A target is a module declaring ``FACTORY = TargetFactory(...)`` and a line in :data:`TARGETS`
(docs/architecture.md, "How to add a target").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from flinkish_core.errors import OptionError

if TYPE_CHECKING:
    from flinkish_core.config import Option
    from flinkish_sink.options import TargetOptions
    from flinkish_sink.target import AnyTarget

#: Each target's module, by name, in the order the docs list them.
TARGETS: dict[str, str] = {
    "postgres": "flinkish_sink.postgres_target",
    "parquet": "flinkish_sink.parquet_target",
    "delta": "flinkish_sink.delta_target",
    "iceberg": "flinkish_sink.iceberg_target",
    "kafka": "flinkish_sink.kafka_target",
}


@dataclass(frozen=True)
class TargetFactory:
    """What a target module declares as ``FACTORY``.

    Args:
        name: the value of option ``target`` that selects it.
        options: every option it reads besides the sink's own.
        create: builds the target from its options; with ``late``, the side output that
            takes late rows (``lateData=side``).
        required: the options it cannot do without, each with a hint of what to give
            (``""``: none); the CLI's ``transactions`` asks for them too.
        side_output: the option naming where late rows go with ``lateData=side`` (None: the
            target has no side output).
        check: its rules across options, raising OptionError (the options' own types and
            checks have run).
        cli_option: the option ``flinkish transactions --<name> VALUE`` gives (its location:
            ``path``, ``dsn``, ``catalog.uri``).
        title: its name in prose (``PostgreSQL``).
        doc: a line for the docs' list of targets.
    """

    name: str
    options: tuple[Option[Any], ...]
    create: Callable[[TargetOptions, bool], AnyTarget]
    cli_option: str
    title: str
    doc: str
    required: Mapping[Option[Any], str] = field(default_factory=dict)
    side_output: Option[Any] | None = None
    check: Callable[[TargetOptions], object] = lambda options: None


def names() -> list[str]:
    return list(TARGETS)


@cache
def _load(name: str) -> TargetFactory | ImportError:
    try:
        module = importlib.import_module(TARGETS[name])
    except ImportError as exc:
        return exc
    found: TargetFactory = module.FACTORY
    assert found.name == name, f"{TARGETS[name]} declares target {found.name!r}, not {name!r}"
    return found


def factory(name: str) -> TargetFactory:
    """The factory of target ``name`` (a key of :data:`TARGETS`).

    Raises:
        OptionError: the target's packages are not installed (names the extra to install).
    """
    found = _load(name)
    if isinstance(found, ImportError):
        raise OptionError(
            f"target {name} needs packages that are not installed ({found}): install "
            f"flinkish[{name}]") from found
    return found


def installed() -> list[TargetFactory]:
    """The factories of the targets whose packages are installed."""
    return [f for f in map(_load, TARGETS) if isinstance(f, TargetFactory)]


def taking(option: Option[Any]) -> list[str]:
    """The installed targets that take ``option``."""
    return [f.name for f in installed() if option in f.options]


def listed(items: Iterable[str], conjunction: str) -> str:
    """``"a, b and c"`` (or ``or``)."""
    items = list(items)
    return items[0] if len(items) == 1 else (
        f"{', '.join(items[:-1])} {conjunction} {items[-1]}")
