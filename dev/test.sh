#!/usr/bin/env bash
# Installs everything and runs every check: ruff, mypy on the core packages, the docs site's
# build (warnings as errors), then the unit tests and the integration tests (the docs' examples
# among them) against a real broker, real Spark and real PostgreSQL.
#
# With arguments, pytest runs just those. Without, two lanes run at once (the tests mostly
# wait: on Spark's triggers, on drivers starting, on sockets), each a pytest process with its
# own broker, PostgreSQL and S3 server: the session's lane (the integration tests sharing one
# SparkSession, and the cluster's module) and a lane of the unit tests, then the modules that
# run queries in drivers of their own (the sink's crash suite, the demo, the crash tests of
# windows and of the valve, Spark Connect's server, the docs' pages), about as long as the
# first lane. Either failing fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash dev/setup.sh test
.venv/bin/ruff check .
.venv/bin/mypy
SKIP_SETUP=1 bash dev/docs.sh
# The tests' Spark drivers live for seconds to minutes: the JIT's C1 tier alone and the serial
# collector halve their CPU (C2's compiler threads and the parallel collector's threads pay
# off only in long runs), which leaves room on 2 cores for Spark's fixed timeouts. Thread
# stacks stay the JVM's default, as users' are.
export SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:-} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
own_drivers=(
  integration/test_sink_crash.py integration/test_demo.py integration/test_window_crash.py integration/test_windows_crash.py
  integration/test_valve_epochs.py integration/test_worker_python.py
  integration/test_concurrent_queries.py integration/test_packaging.py
  integration/test_spark_connect.py integration/test_docs_examples.py
  integration/test_kafka_sink_crash.py
)
lanes=$(mktemp -d)
(
  failed=0
  .venv/bin/python -m pytest -q -n 2 -p no:cacheprovider --basetemp "$lanes/unit" tests \
    || failed=1
  .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$lanes/drivers" \
    "${own_drivers[@]}" || failed=1
  exit "$failed"
) > "$lanes/second.log" 2>&1 &
second=$!
trap 'pkill -P "$second" 2>/dev/null || true; wait "$second" 2>/dev/null || true; rm -rf "$lanes"' EXIT
ignored=()
for module in "${own_drivers[@]}"; do ignored+=(--ignore "$module"); done
status=0
.venv/bin/python -m pytest -q --basetemp "$lanes/session" integration "${ignored[@]}" \
  || status=$?
wait "$second" || status=$((status ? status : $?))
echo "== the second lane (unit tests, then drivers of their own):"
cat "$lanes/second.log"
exit "$status"
