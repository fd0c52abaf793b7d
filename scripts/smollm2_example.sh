#!/usr/bin/env bash
# The SmolLM2-135M-Instruct example in docs/smollm2-example: a sweep of the real pretrained pair
# on the bundled engine (`--model smollm2`: int8 weights, the in-repo draft smollm2-draft), and
# the audit of its speculative output against target-only. Usage:
#   scripts/smollm2_example.sh [OUT_DIR]      (about 15 minutes on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/smollm2-example}
. .venv/bin/activate
rm -rf "$OUT/sweep" "$OUT/audit"
spectest sweep --embedded --model smollm2 --steps 1,2,4 --step-time 30 --warmup 6 \
  --validate-k off --out "$OUT/sweep"
spectest audit --candidate embedded --baseline embedded --embedded-model smollm2 \
  --out "$OUT/audit"
