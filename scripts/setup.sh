#!/usr/bin/env bash
# Installs what ferroce needs on a fresh Debian 12 and prepares the machine (root):
# DPDK 22.11 and its headers, libclang for bindgen, iproute2/ping for the integration tests,
# libibverbs-dev (the verbs.h the compatibility library is generated from), ibverbs-utils and
# perftest (the unmodified tools its tests run) and gcc (for the C verbs program they build),
# tshark and scapy for the wire cross-checks, schemathesis for the API fuzzing, DejaVu fonts for the benchmark plots, Prometheus
# and promtool for the /metrics tests (which start their own server on 127.0.0.1:7549; where
# systemd runs, Debian also starts its packaged one on :9090, unused by ferroce), 2 MiB
# hugepages reserved and hugetlbfs mounted
# on /dev/hugepages, and the Kubernetes schema checkers. Idempotent. (The container test,
# tests/docker/run.py, installs and starts the Docker engine itself: scripts/docker-engine.sh.)
set -euo pipefail

PKGS=(dpdk dpdk-dev libdpdk-dev libclang-dev clang pkg-config iproute2 iputils-ping procps tshark python3-pip fonts-dejavu-core prometheus libibverbs-dev librdmacm-dev ibverbs-utils rdmacm-utils perftest gcc valgrind systemd)
HUGEPAGES=${FERROCE_HUGEPAGES:-1024}

if [ "$(id -u)" != 0 ]; then
  echo "setup: needs root (apt-get, hugepages, mounts); run it with sudo" >&2
  exit 1
fi

bash "$(dirname "$0")/apt-install.sh" setup "${PKGS[@]}"

# scapy (its RoCE layer is the independent implementation the wire tests cross-check against).
if ! python3 -c 'import scapy.contrib.roce' 2>/dev/null; then
  echo "setup: installing scapy"
  python3 -m pip install -q scapy 2>/dev/null || python3 -m pip install -q --break-system-packages scapy
fi
# schemathesis (fuzzes the REST API against its OpenAPI document in the tests).
if ! command -v schemathesis >/dev/null; then
  echo "setup: installing schemathesis"
  python3 -m pip install -q schemathesis 2>/dev/null || python3 -m pip install -q --break-system-packages schemathesis
fi

# The Kubernetes manifests' schema checks (controlplane/tests/deploy.rs): kubernetes-validate for
# the API's own kinds, the Prometheus Operator's CRD schemas (npm; they declare Node 22 and run
# on Debian's and this machine's older ones, as the test checks) for the ServiceMonitor.
if ! command -v kubernetes-validate >/dev/null; then
  echo "setup: installing kubernetes-validate"
  python3 -m pip install -q kubernetes-validate==1.37.0 2>/dev/null \
    || python3 -m pip install -q --break-system-packages kubernetes-validate==1.37.0
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  bash "$(dirname "$0")/apt-install.sh" setup nodejs npm
fi
NODE_DIR=/usr/local/lib/ferroce-node
if [ ! -f "$NODE_DIR/node_modules/@kubernetes-models/prometheus-operator/package.json" ]; then
  echo "setup: installing the Prometheus Operator's schemas in $NODE_DIR"
  mkdir -p "$NODE_DIR"
  npm install --loglevel=error --no-audit --no-fund --prefix "$NODE_DIR" \
    @kubernetes-models/prometheus-operator@6.0.0 js-yaml@4.1.0 >/dev/null
fi

total=$(awk '/^HugePages_Total:/ {print $2}' /proc/meminfo)
if [ "${total:-0}" -lt "$HUGEPAGES" ]; then
  echo "$HUGEPAGES" > /proc/sys/vm/nr_hugepages
  total=$(awk '/^HugePages_Total:/ {print $2}' /proc/meminfo)
  echo "setup: $total hugepages of 2 MiB reserved"
fi
mkdir -p /dev/hugepages
if ! awk '$2 == "/dev/hugepages" && $3 == "hugetlbfs" {found=1} END {exit !found}' /proc/mounts; then
  mount -t hugetlbfs nodev /dev/hugepages
  echo "setup: hugetlbfs mounted on /dev/hugepages"
fi
mkdir -p /run/ferroce
