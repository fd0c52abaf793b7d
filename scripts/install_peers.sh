#!/usr/bin/env bash
# Install the load-testing tools spectest is compared with, each pinned and in its own cached
# virtual environment (they pull dependencies spectest does not want: AIPerf's transformers,
# GuideLLM's torch): NVIDIA AIPerf 0.13.0 and GuideLLM 0.8.1. Prints each environment's bin/
# directory. Idempotent (a complete environment has a marker file); everything comes through pip
# from the package index pip is configured for. Used by benchmarks/peer_agreement.py.
#
#   scripts/install_peers.sh [aiperf] [guidellm]      # default: both
set -euo pipefail

CACHE=${SPECTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spectest}
HOST_PY=${PYTHON:-python3}
declare -A PIN=([aiperf]="aiperf==0.13.0" [guidellm]="guidellm==0.8.1")
# GuideLLM depends on torch: the CPU build first, or pip takes several GB of CUDA wheels
declare -A FIRST=([aiperf]="" [guidellm]="torch==2.13.0")

tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(aiperf guidellm)
for tool in "${tools[@]}"; do
    pin=${PIN[$tool]:-}
    if [ -z "$pin" ]; then
        echo "error: unknown tool '$tool' (choose from: ${!PIN[*]})" >&2
        exit 1
    fi
    venv=$CACHE/peers/${pin/==/-}/venv
    if [ -f "$venv/.spectest-complete" ]; then
        echo "$pin already installed"
        echo "$venv/bin"
        continue
    fi
    start=$(date +%s)
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$HOST_PY" -m venv "$venv" || { echo "error: '$HOST_PY -m venv' failed" >&2; exit 1; }
    if [ -n "${FIRST[$tool]}" ]; then
        "$venv/bin/python" -m pip install -q --disable-pip-version-check "${FIRST[$tool]}"
    fi
    if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "$pin"; then
        echo "error: pip could not install $pin (see pip's message above)" >&2
        rm -rf "$venv"
        exit 1
    fi
    date -u +%FT%TZ > "$venv/.spectest-complete"
    echo "$pin installed in $(( $(date +%s) - start )) s"
    echo "$venv/bin"
done
