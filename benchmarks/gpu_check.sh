#!/usr/bin/env bash
# The bundled engine on a GPU, checked in one short run: under 5 minutes, no network needed there.
#
# Runs benchmarks/gpu_check.py (its docstring lists the sections): the embedded pair on the
# device (greedy output identical to target-only, sampled requests, host waits per round, CUDA
# graphs), benchmarks/engine_speedup.py with transformers on the same device,
# benchmarks/gpu_models.py (a step and a verify of K+1 tokens at SmolLM2-135M's and a 1B Llama's
# sizes, random weights, engine against transformers), `spectest serve --device cuda` with a
# short sweep and the default audit against it, and `spectest profile` on the device (where a
# round's time goes). Prints one table. First run on an H200: 177 s (docs/results.md).
#
#   bash benchmarks/gpu_check.sh --fetch-wheels   # here, where pip works: the packages the GPU
#                                                 # image lacks, into .gpu-check/wheels (~20 MB)
#   bash benchmarks/gpu_check.sh                  # on the GPU machine (carry .gpu-check)
#   bash benchmarks/gpu_check.sh --device cpu --quick   # this script's logic, on a CPU
#
# The GPU image has torch (CUDA), transformers, numpy, scipy, pandas, aiohttp, prometheus-client
# and uvloop, but not pydantic, OpenTelemetry, orjson or Locust, which `spectest serve`, `sweep`
# and `audit` import: without the wheels the serve section says SKIPPED and the rest runs.
# What travels to a device call is at most 64 MiB: the tracked tree is ~78 MB, so move
# spectest/models/smollm2-draft and smollm2-eagle (48 MB; the check does not use them) out of
# the working tree for the call, e.g. `mv spectest/models/smollm2-* /tmp/` and back after.
# Extra arguments go to gpu_check.py (--sections, --out, --section-timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.gpu-check/wheels
# versions as installed here (the project's venv); cp312 manylinux x86-64 builds
PACKAGES=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
          opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2
          opentelemetry-semantic-conventions==0.66b2 orjson==3.13.0
          locust==2.47.0 flask==3.1.3 flask-cors==6.0.5 flask-login==0.6.3 itsdangerous==2.2.0
          blinker==1.9.0 gevent==26.9.0 greenlet==3.5.6 zope.event==6.2 zope.interface==8.7
          geventhttpclient==2.6.1 brotli==1.2.1 configargparse==1.9.0 pyzmq==27.3.0
          python-engineio==4.15.1 python-socketio==5.18.1 bidict==0.24.1 simple-websocket==1.1.0
          wsproto==1.3.2)

if [ "${1:-}" = "--fetch-wheels" ]; then
  mkdir -p "$WHEELS"
  for p in "${PACKAGES[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" "$p"
  done
  du -sh "$WHEELS"
  echo "gpu_check: wheels in $WHEELS; carry .gpu-check in the device call"
  exit 0
fi

# the carried wheels, where this Python lacks them (the GPU image's is 3.12)
if ls "$WHEELS"/*.whl >/dev/null 2>&1 && ! python3 -c "import pydantic, locust" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu-check-site "$WHEELS"/*.whl
  export PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader || true
OUT_DIR=${OUT:-gpu-check-out}
exec timeout 295 python3 benchmarks/gpu_check.py --out "$OUT_DIR" "$@"
