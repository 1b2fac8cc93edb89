#!/usr/bin/env bash
# The Docker engine for the container tests and `make compose` (root):
#   docker-engine.sh start   installs Debian's docker.io, docker-compose and debootstrap when
#                            missing, and starts dockerd unless an engine already answers;
#                            prints "started PID" or "running" (someone else's engine: left alone)
#   docker-engine.sh stop    stops the dockerd this script started (its pidfile), and only that
#                            one, and removes the docker0 bridge it left
# Where the host's FORWARD policy accepts, the dockerd started here leaves the firewall and
# forwarding as they were (--iptables=false --ip6tables=false --ip-forward=false
# --ip-masq=false): the veth, bridge and Soft-RoCE VM tests share this host, and a default
# engine turns the host's ip_forward on (which new namespaces inherit) and its FORWARD policy to
# DROP. Containers still talk to each other on their compose network and to the host through
# published ports (docker-proxy); image builds that fetch packages run with --network host.
set -euo pipefail
cd "$(dirname "$0")/.."
PIDFILE=/run/ferroce-dockerd.pid
LOG=${FERROCE_DOCKERD_LOG:-target/dockerd.log}

case "${1:-}" in
start)
  bash scripts/apt-install.sh docker-engine docker.io docker-compose debootstrap
  if /usr/bin/docker info >/dev/null 2>&1; then
    echo running
    exit 0
  fi
  mkdir -p "$(dirname "$LOG")"
  # Hands off the firewall, unless the host's FORWARD policy already drops (a Docker engine ran
  # here before and left its chains, or a hardened host): with bridged frames going through
  # netfilter (br_netfilter), containers on one network could not reach each other, so dockerd
  # then manages its rules and forwarding as it does by default.
  flags=(--iptables=false --ip6tables=false --ip-forward=false --ip-masq=false)
  if command -v iptables >/dev/null && ! iptables -S FORWARD 2>/dev/null | grep -qx -- '-P FORWARD ACCEPT'; then
    echo "docker-engine: the host's FORWARD policy is not ACCEPT: dockerd manages its iptables rules"
    flags=()
  fi
  dockerd "${flags[@]}" --pidfile "$PIDFILE" >"$LOG" 2>&1 &
  pid=$!
  for _ in $(seq 150); do
    if /usr/bin/docker info >/dev/null 2>&1; then
      echo "started $pid"
      exit 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  echo "docker-engine: dockerd did not come up; its log ($LOG):" >&2
  tail -20 "$LOG" >&2
  kill "$pid" 2>/dev/null || true
  exit 1
  ;;
stop)
  [ -f "$PIDFILE" ] || exit 0
  pid=$(cat "$PIDFILE")
  kill "$pid" 2>/dev/null || exit 0
  for _ in $(seq 150); do
    if ! kill -0 "$pid" 2>/dev/null; then
      # Its default bridge outlives it; the next start makes it again.
      ip link delete docker0 2>/dev/null || true
      exit 0
    fi
    sleep 0.2
  done
  echo "docker-engine: dockerd $pid still running after 30 s" >&2
  exit 1
  ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac
