#!/usr/bin/env bash
# Installs everything and runs every check: ruff, mypy on the core packages, then the unit
# tests and the integration tests against a real broker, real Spark and real PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash dev/setup.sh test
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -q "$@"
