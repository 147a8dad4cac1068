"""flinkish: Flink's per-partition watermarks, idleness, StatusWatermarkValve and
two-phase-commit sinks for Spark Structured Streaming."""

from __future__ import annotations

from flinkish.session import register

__all__ = ["register"]
