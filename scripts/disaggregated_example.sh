#!/usr/bin/env bash
# The co-located vs disaggregated comparison in docs/disaggregated-example: the same sweep of the
# embedded pair twice — the draft in the server's process, then in its own `spectest serve-draft`
# reached over loopback HTTP — and `spectest compare` of the two. Usage:
#   scripts/disaggregated_example.sh [OUT_DIR]      (about 8 minutes on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/disaggregated-example}
. .venv/bin/activate
rm -rf "$OUT/colocated" "$OUT/disaggregated" "$OUT/compare"
common=(--workloads chat,code --steps 1,2,4 --verify-advice off)
spectest sweep --embedded "${common[@]}" --out "$OUT/colocated"
spectest sweep --embedded --disaggregated "${common[@]}" --out "$OUT/disaggregated"
spectest compare "$OUT/colocated" "$OUT/disaggregated" --out "$OUT/compare"
spectest report "$OUT/colocated" --network-ms 2 --out "$OUT/what-if-2ms"
