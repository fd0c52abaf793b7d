#!/usr/bin/env bash
# The main job on the embedded default, from a fresh clone: set up, start the bundled
# speculative engine, run a short load sweep (speculation on vs off), audit speculative output
# against the target-only baseline, and write a report. Usage: scripts/demo.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/demo}
scripts/setup.sh
. .venv/bin/activate
echo "== spectest demo: generation with the embedded target/draft pair =="
spectest generate --max-tokens 48 "def fibonacci(n):" "The json module"
