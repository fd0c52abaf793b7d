#!/usr/bin/env bash
# GuideLLM 0.8.1 runs against the same two servers as run_aiperf.sh (speculative on 18101, plain
# on 18102): concurrent streams 1, 2 and 4, 20 requests per level, 64 synthetic prompt tokens,
# 32 output tokens (ignore_eos, temperature 0). The spec and base files are packed in
# tests/report/peer_runs.tar.gz (under peer_runs/guidellm/) and shown in docs/peer-runs.md; the
# rate-based run (constant 2 req/s, 4 requests) is not packed: spectest leaves such a run out.
#
#   scripts/install_peers.sh guidellm
#   docs/peer-runs-example/run_guidellm.sh OUT      # → OUT/{spec,base,rate}/benchmarks.json
set -euo pipefail
OUT=${1:?usage: run_guidellm.sh OUT}
BIN=${GUIDELLM_BIN:-$HOME/.cache/spectest/peers/guidellm-0.8.1/venv/bin}
TOKENIZER=${TOKENIZER:-$(cd "$(dirname "$0")/../.." && pwd)/spectest/models/target}
unset HF_HUB_OFFLINE
run() {  # name port profile count
    mkdir -p "$OUT/$1"
    timeout 400 "$BIN/guidellm" run \
        --backend "{\"kind\":\"openai_http\",\"target\":\"http://127.0.0.1:$2\",\"model\":\"spectest-demo\",\"extras\":{\"body\":{\"ignore_eos\":true,\"temperature\":0}}}" \
        --profile "$3" --constraint "kind=max_requests,count=$4" \
        --tokenizer "kind=hf_auto,model=$TOKENIZER" \
        --data kind=synthetic_text,prompt_tokens=64,output_tokens=32 \
        --output "kind=json,path=$OUT/$1/benchmarks.json" --disable-console-interactive \
        > "$OUT/$1.log" 2>&1
    echo "$1 done"
}
run spec 18101 '{"kind":"concurrent","streams":[1,2,4]}' 20
run base 18102 '{"kind":"concurrent","streams":[1,2,4]}' 20
run rate 18102 kind=constant,rate=2 4
