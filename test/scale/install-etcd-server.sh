#!/usr/bin/env bash
# Installs Debian's etcd-server package (/usr/bin/etcd, whose `etcd grpc-proxy start` make bench-scale
# runs) without starting the package's own etcd service. Does nothing when /usr/bin/etcd exists.
set -euo pipefail
[ -x /usr/bin/etcd ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "install-etcd-server.sh: run as root (apt-get install etcd-server)" >&2
  exit 1
fi
# The package's init script would start a system etcd on 127.0.0.1:2379: forbid service starts while
# installing (policy-rc.d exit 101), unless a policy is in place already.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
/usr/bin/etcd --version | head -1
