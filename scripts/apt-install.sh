#!/usr/bin/env bash
# apt-install.sh WHO PKG...: installs those of Debian's packages PKG that are missing (root),
# saying "WHO: installing ..." first; nothing when all are there. setup.sh and docker-engine.sh
# use it.
set -euo pipefail
who=$1
shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "$who: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
