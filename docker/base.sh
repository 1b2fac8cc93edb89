#!/usr/bin/env bash
# Builds the base images without a container registry (root; debootstrap and a Docker engine):
#   ferroce/debian:bookworm-slim   Debian 12 minbase from Debian's mirror (what debian:bookworm-slim
#                                  is on a machine that reaches Docker Hub), with the same apt sources
#   ferroce/rust:bookworm          that base plus this host's Rust toolchain (cargo, rustc and the
#                                  standard library, as `cargo build` uses them here)
# Each is rebuilt only when missing (FERROCE_REBUILD_BASE=1 forces it). Prints one line per image
# with the seconds it took.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKER=${DOCKER:-/usr/bin/docker}
MIRROR=${FERROCE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=ferroce/debian:bookworm-slim
RUST=ferroce/rust:bookworm
work=target/docker
mkdir -p "$work"

secs() { echo $((($(date +%s%N) - $1) / 1000000000)); }
have() { [ "${FERROCE_REBUILD_BASE:-0}" != 1 ] && "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

if ! have "$BASE"; then
  t0=$(date +%s%N)
  root="$work/rootfs"
  rm -rf "$root"
  debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log"; echo "base: debootstrap failed" >&2; exit 1; }
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  # As the slim image: no package lists, caches or docs kept.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
  tar -C "$root" -c . | "$DOCKER" import --change 'CMD ["bash"]' - "$BASE" >/dev/null
  rm -rf "$root"
  echo "base: $BASE from debootstrap --variant=minbase bookworm in $(secs "$t0") s"
fi

if ! have "$RUST"; then
  t0=$(date +%s%N)
  sysroot=$(rustc --print sysroot)
  ctx="$work/rust"
  rm -rf "$ctx"
  mkdir -p "$ctx/rust/bin"
  # Hard links where the toolchain shares the file system (no copy), else a copy.
  cp -al "$sysroot/lib" "$ctx/rust/" 2>/dev/null || cp -a "$sysroot/lib" "$ctx/rust/"
  cp -a "$sysroot/bin/cargo" "$sysroot/bin/rustc" "$ctx/rust/bin/"
  # The certificate authorities this host's cargo trusts (a network may put its own in front of
  # crates.io), for cargo alone: the image's system store stays Debian's.
  cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$ctx/rust/ca-certificates.crt"
  cat >"$ctx/Dockerfile" <<DF
FROM $BASE
COPY rust /usr/local/rust
ENV PATH=/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CARGO_HOME=/usr/local/cargo CARGO_HTTP_CAINFO=/usr/local/rust/ca-certificates.crt
DF
  "$DOCKER" build -q -t "$RUST" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "base: $RUST ($(rustc --version)) in $(secs "$t0") s"
fi
