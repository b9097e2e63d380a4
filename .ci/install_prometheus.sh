#!/bin/sh
# Install Prometheus (the Debian package) for tests/integration/test_prometheus.py, quietly and idempotently:
# nothing is done when a prometheus binary is already on PATH. Needs Debian/Ubuntu with apt-get,
# as root or with sudo. Without Prometheus that test is skipped with the reason.
set -eu
if command -v prometheus >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_prometheus.sh: no apt-get here; install Prometheus >= 2.x by hand (tests/integration/test_prometheus.py is skipped without it)" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
prometheus --version 2>&1 | head -n 1
