#!/usr/bin/env bash
# Install what the browser and deploy tests need on a fresh Debian machine (run as root): Chromium
# from Debian's packages and fonts for legible screenshots, and Debian's Prometheus server, which
# scrapes a running `memest serve` and answers the Grafana dashboard's queries
# (tests/integration/test_prometheus.py). Idempotent and quick when already installed.
# Playwright drives /usr/bin/chromium; `playwright install` (a browser download) is never needed.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
dpkg -s fonts-dejavu-core >/dev/null 2>&1 || need+=(fonts-dejavu-core)
# The package's own service is not wanted: the test starts its own server on a free port.
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-test-extras: missing ${need[*]}; run as root (or install them) for the browser and deploy tests" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-test-extras: no apt-get; install ${need[*]} by hand for the browser and deploy tests" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "setup-test-extras: installed ${need[*]}"
