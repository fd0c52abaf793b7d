#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Real servers and corpora the tests use: Prometheus + promtool (Debian package, run on
# loopback by the tests), and the Python docs (training corpus of the reproducibility test).
scripts/install_prometheus.sh
if [ ! -d /usr/share/doc/python3.11/html/_sources ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3.11-doc >/dev/null
fi
scripts/setup.sh --test
. .venv/bin/activate
export CI=${CI:-1}
exec python -m pytest -q -p no:cacheprovider "$@"
