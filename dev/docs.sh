#!/usr/bin/env bash
# Builds the docs site (MkDocs, mkdocs.yml) into site/ with warnings as errors: a broken link or
# anchor, a page missing from the nav or an API name mkdocstrings cannot document fails it.
# Installs the docs tools first unless SKIP_SETUP is set. `bash dev/docs.sh serve` previews it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${SKIP_SETUP:-}" ] || bash dev/setup.sh docs
export NO_MKDOCS_2_WARNING=1  # Material's notice about its successor, printed at every build
if [ "${1:-}" = "serve" ]; then exec .venv/bin/mkdocs serve --strict; fi
exec .venv/bin/mkdocs build --strict --quiet
