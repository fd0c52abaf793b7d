#!/usr/bin/env bash
# Install Prometheus and promtool from Debian/Ubuntu's `prometheus` package, if missing.
# Idempotent: does nothing when both binaries are already on PATH.  CI runs it before the tests
# (tests/alerts uses promtool; tests/e2e starts a real Prometheus on 127.0.0.1).
#
# Note: on a machine with systemd the package also enables a prometheus.service on :9090; the
# tests never use it (they start their own instance on a free port) — stop it if unwanted:
#   sudo systemctl disable --now prometheus
set -euo pipefail

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    echo "prometheus already installed: $(prometheus --version 2>&1 | head -n1)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: apt-get not found; install Prometheus (prometheus + promtool) by hand" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "error: need root or sudo to apt-get install prometheus" >&2
        exit 1
    fi
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus

for bin in prometheus promtool; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "error: $bin still not on PATH after installing the prometheus package" >&2
        exit 1
    fi
done
echo "installed: $(prometheus --version 2>&1 | head -n1)"
