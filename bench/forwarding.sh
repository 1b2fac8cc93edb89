#!/usr/bin/env bash
# `make bench`: roced's lcore loop against dpdk-testpmd macswap on memif, in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p bench -p controlplane
mkdir -p bench/results
exec target/release/forwarding --report "bench/results/forwarding-$(date +%Y-%m-%d).md" "$@"
