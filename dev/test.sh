#!/usr/bin/env bash
# Installs everything and runs every test: unit tests, then integration tests against a real
# broker, real Spark and real PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash dev/setup.sh test
exec .venv/bin/python -m pytest -q "$@"
