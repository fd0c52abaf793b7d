#!/usr/bin/env bash
# The SmolLM2-135M-Instruct examples: a sweep of the real pretrained model on the bundled engine
# (`--model smollm2`: int8 weights) drafting with DRAFTER — draft-model (the in-repo draft
# smollm2-draft; docs/smollm2-example), eagle (the in-repo EAGLE head smollm2-eagle;
# docs/smollm2-eagle-example) or ngram+eagle (prompt lookup, the EAGLE head where nothing
# matches; docs/smollm2-hybrid-example) — and the audit of its speculative output against
# target-only.
# Usage:
#   scripts/smollm2_example.sh [OUT_DIR] [DRAFTER]      (about 27 minutes on 2 CPU cores)
#   SPECTEST_SMOKE=1 scripts/smollm2_example.sh /tmp/x ngram+eagle   # short mode: token sizes
#                                                (spectest.smoke; what the docs' tests run)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/smollm2-example}
DRAFTER=${2:-draft-model}
. .venv/bin/activate
rm -rf "$OUT/sweep" "$OUT/audit"
spectest sweep --embedded --model smollm2 --drafter "$DRAFTER" --steps 1,2,4 --step-time 30 \
  --warmup 6 --verify-advice off --out "$OUT/sweep"
spectest audit --candidate embedded --baseline embedded --embedded-model smollm2 \
  --embedded-drafter "$DRAFTER" --out "$OUT/audit"
