#!/usr/bin/env bash
# Installs everything and runs every check: ruff, mypy on the core packages, the docs site's
# build (warnings as errors), then the unit tests and the integration tests (the docs' examples
# among them) against a real broker, real Spark and real PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash dev/setup.sh test
.venv/bin/ruff check .
.venv/bin/mypy
SKIP_SETUP=1 bash dev/docs.sh
exec .venv/bin/python -m pytest -q "$@"
