#!/usr/bin/env bash
# Installs flinkish and runs the main job (the demo) on the embedded broker.
set -euo pipefail
cd "$(dirname "$0")/.."
bash dev/setup.sh
exec .venv/bin/flinkish demo "$@"
