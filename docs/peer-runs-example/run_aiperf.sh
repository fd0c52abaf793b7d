#!/usr/bin/env bash
# The AIPerf runs behind docs/peer-runs.md (packed in tests/report/peer_runs.tar.gz, under
# peer_runs/aiperf/): one speculative and one plain `spectest serve` (the bundled embedded pair,
# one torch thread each, loopback), measured by NVIDIA AIPerf 0.13.0 at concurrency 1, 2 and 4,
# the arms interleaved per concurrency (spec then plain), 1 warm-up request then 24 requests of
# 64 synthetic prompt tokens and 64 output tokens each (ignore_eos, temperature 0, seed 0).
#
#   scripts/install_peers.sh aiperf
#   spectest serve --port 18101 --threads 1 &                  # speculative (draft model, K=4)
#   spectest serve --port 18102 --threads 1 --drafter none &   # plain
#   docs/peer-runs-example/run_aiperf.sh OUT                   # → OUT/spec/cN, OUT/base/cN
set -euo pipefail
OUT=${1:?usage: run_aiperf.sh OUT}
PY=${AIPERF_PYTHON:-$HOME/.cache/spectest/peers/aiperf-0.13.0/venv/bin/python}
TOKENIZER=${TOKENIZER:-$(cd "$(dirname "$0")/../.." && pwd)/spectest/models/target}
unset HF_HUB_OFFLINE  # a local tokenizer folder: AIPerf refuses offline mode for it
for c in 1 2 4; do
    for arm in spec:18101 base:18102; do
        name=${arm%%:*} port=${arm##*:}
        timeout 300 "$PY" -m aiperf profile --model spectest-demo --url "http://127.0.0.1:$port" \
            --endpoint-type chat --streaming --tokenizer "$TOKENIZER" --isl 64 --osl 64 \
            --extra-inputs ignore_eos:true --extra-inputs temperature:0 --concurrency "$c" \
            --request-count 24 --warmup-request-count 1 --random-seed 0 --ui none \
            --no-gpu-telemetry --workers-max 2 --export-level records \
            --artifact-dir "$OUT/$name/c$c" > "$OUT/$name-c$c.log" 2>&1
        echo "$name c=$c done"
    done
done
