#!/usr/bin/env bash
# Installs the peers and load generators of the namespace benchmark (bench/harness.ts) from Debian:
# iperf3, wrk, dnsperf, HAProxy, nginx with the stream module, dnsmasq. Idempotent; needs root.
# No daemon is started: packages whose install would start a service are installed with service
# starts refused (policy-rc.d), and the benchmark runs every program itself inside its namespaces.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "bench/setup.sh: needs root (apt-get install)" >&2
  exit 1
fi

# Debian package → a program it provides (checked to skip what is already there).
declare -A wanted=(
  [iperf3]=iperf3
  [wrk]=wrk
  [dnsperf]=dnsperf
  [haproxy]=haproxy
  [nginx]=nginx
  [libnginx-mod-stream]=/usr/lib/nginx/modules/ngx_stream_module.so
  # dnsmasq-base: the program without the system service (the benchmark runs it in a namespace).
  [dnsmasq-base]=dnsmasq
  [iproute2]=ip
  [iptables]=iptables
)

missing=()
for pkg in "${!wanted[@]}"; do
  prog=${wanted[$pkg]}
  if [[ $prog == /* ]]; then [ -e "$prog" ] && continue; else command -v "$prog" >/dev/null 2>&1 && continue; fi
  missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "bench/setup.sh: everything is installed"
  exit 0
fi

# Refuse service starts during the install (nginx and haproxy would otherwise listen on the host).
created_policy=
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  created_policy=1
fi
cleanup() { if [ -n "$created_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq

# Install what Debian has; report (and skip) what it does not, so one missing tool does not stop the rest.
installable=()
for pkg in "${missing[@]}"; do
  if apt-cache show "$pkg" >/dev/null 2>&1; then
    installable+=("$pkg")
  else
    echo "bench/setup.sh: Debian has no package '$pkg'; the benchmark skips what needs it" >&2
  fi
done
if [ ${#installable[@]} -gt 0 ]; then
  echo "bench/setup.sh: installing ${installable[*]}"
  apt-get install -y -qq --no-install-recommends "${installable[@]}" >/dev/null
fi

for pkg in "${!wanted[@]}"; do
  prog=${wanted[$pkg]}
  if [[ $prog == /* ]]; then ok=$([ -e "$prog" ] && echo yes || echo no); else
    ok=$(command -v "$prog" >/dev/null 2>&1 && echo yes || echo no)
  fi
  printf '  %-22s %s\n' "$pkg" "$ok"
done
