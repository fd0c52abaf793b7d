#!/usr/bin/env bash
# The main job on the embedded default, from a fresh clone: set up, start the bundled
# speculative engine, run a short load sweep (speculation on vs off, chat/code/rag traffic at
# rising concurrency), audit speculative output against the target-only baseline, and write a
# report. Usage: scripts/demo.sh [OUT_DIR]     (about 10-15 minutes on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/demo}
scripts/setup.sh
. .venv/bin/activate
echo "== 1/2 load sweep on the bundled engine (server started and stopped by spectest) =="
# up to two looks of 10 s per step and arm until the step's verdicts are settled
spectest sweep --embedded --max-step-time 20 --out "$OUT/sweep"
echo "== 2/2 audit: speculative vs target-only output =="
status=0
spectest audit --candidate embedded --baseline embedded --out "$OUT/audit" || status=$?
echo
echo "report:  $OUT/sweep/report.html  (Markdown: $OUT/sweep/report.md)"
echo "audit:   $OUT/audit  (exit $status: 0 pass, 1 drift, 2 could not run)"
exit $status
