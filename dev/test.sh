#!/usr/bin/env bash
# Installs everything and runs every check: ruff, mypy on the core packages, the docs site's
# build (warnings as errors), then the unit tests and the integration tests (the docs' examples
# among them) against a real broker, real Spark and real PostgreSQL.
#
# With arguments, pytest runs just those. Without, the tests run in two lanes at once, each a
# pytest process with its own broker, PostgreSQL and S3 server: the modules marked own_driver
# (their Spark runs in driver processes they start and kill, waiting on start-ups most of the
# time) and the rest (one shared SparkSession). Either lane failing fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash dev/setup.sh test
.venv/bin/ruff check .
.venv/bin/mypy
SKIP_SETUP=1 bash dev/docs.sh
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
lanes=$(mktemp -d)
.venv/bin/python -m pytest -q -m own_driver --basetemp "$lanes/own-driver" integration \
  > "$lanes/own-driver.log" 2>&1 &
drivers=$!
trap 'kill -- "$drivers" 2>/dev/null; wait "$drivers" 2>/dev/null; rm -rf "$lanes"' EXIT
status=0
.venv/bin/python -m pytest -q -m "not own_driver" --basetemp "$lanes/session" tests integration \
  || status=$?
wait "$drivers" || status=$((status ? status : $?))
echo "== the own_driver lane:"
cat "$lanes/own-driver.log"
exit "$status"
