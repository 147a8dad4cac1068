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
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q -n 4 tests
exec .venv/bin/python -m pytest -q integration
