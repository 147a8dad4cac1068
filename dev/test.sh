#!/usr/bin/env bash
# Installs everything and runs every check: ruff, mypy on the core packages, the docs site's
# build (warnings as errors), then the unit tests and the integration tests (the docs' examples
# among them) against a real broker, real Spark and real PostgreSQL.
#
# With arguments, pytest runs just those. Without, the unit tests run first, four at once
# (they mostly wait on sockets and timers), then the integration tests one at a time (they
# share one SparkSession, broker and PostgreSQL, and Spark's fixed 10 s for a new Python worker
# to connect back leaves no room for a second Spark beside them on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash dev/setup.sh test
.venv/bin/ruff check .
.venv/bin/mypy
SKIP_SETUP=1 bash dev/docs.sh
# The tests' Spark drivers live for seconds to minutes: the JIT's C1 tier alone and the serial
# collector halve their CPU (C2's compiler threads and the parallel collector's threads pay
# off only in long runs), which leaves room on 2 cores for Spark's fixed timeouts.
export SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:-} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -n 4 tests
exec .venv/bin/python -m pytest -q integration
