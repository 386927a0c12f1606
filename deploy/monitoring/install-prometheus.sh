#!/usr/bin/env bash
# Installs Debian's prometheus package for promtool (the rule unit tests of deploy/monitoring) and the
# prometheus server (the lab's), without starting the package's own service. Does nothing when
# promtool is on PATH already.
set -euo pipefail
command -v promtool >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "install-prometheus.sh: run as root (apt-get install prometheus)" >&2
  exit 1
fi
# The package's init script would start a system Prometheus on :9090: forbid service starts while
# installing (policy-rc.d exit 101), unless a policy is in place already.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
promtool --version 2>&1 | head -1
