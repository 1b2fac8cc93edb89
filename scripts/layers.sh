#!/usr/bin/env bash
# The layering check (ARCHITECTURE.md): arrows between layers that must not exist, found by
# their imports, counted per file. The arrows that exist today are listed with their counts in
# scripts/layers.allow, to be removed as the restructure goes (issue 20); any new one fails, and
# so does a count lower than allowed (lower the allowance, so that it cannot come back).
#
#   bash scripts/layers.sh            check
#   bash scripts/layers.sh --print    print today's counts in the allowance file's format
set -euo pipefail
cd "$(dirname "$0")/.."

# rule name | the files it covers (find paths) | what they must not name (grep -P)
# (`crate::{a, b}` groups count too: `crate::(\{[^}]*\b)?name\b`.)
rules=(
    "wire-is-the-bottom|dataplane/wire/src|\b(dataplane|dpdk_sys|transport|netsim)::"
    "transport-reads-no-clock|dataplane/transport/src|std::time::(Instant|SystemTime)"
    "cc-is-below-the-engine|dataplane/transport/src/cc|crate::(\{[^}]*\b)?(cq|mr|qp|rc|wr|ops|resp_check|timers)\b"
    "the-simulator-reads-no-clock|dataplane/netsim/src|std::time::(Instant|SystemTime)"
    "the-ip-stack-has-no-dpdk|dataplane/src/net|crate::(\{[^}]*\b)?(dpdk|mem|host)\b|dpdk_sys|\btransport::"
    "controlplane-reaches-dpdk-through-dataplane|controlplane/src|dpdk_sys"
    "the-node-knows-no-http|controlplane/src/rdma|crate::(\{[^}]*\b)?(api|metrics)\b|\baxum::|StatusCode"
    "metrics-and-the-api-share-state-not-each-other|controlplane/src/metrics.rs|crate::(\{[^}]*\b)?api\b"
    "rocectl-needs-only-wire|cli/src|dataplane::(?!wire\b)"
    "the-application-rings-stand-alone|verbs/src|\b(dataplane|dpdk_sys|transport|netsim|wire|controlplane)::"
    "the-compatibility-library-speaks-only-verbs|ibverbs/src|\b(dataplane|dpdk_sys|transport|netsim|wire|controlplane)::"
    "the-c-library-speaks-only-verbs|capi/src|\b(dataplane|dpdk_sys|transport|netsim|wire|controlplane)::"
)

count() {
    local out=""
    for r in "${rules[@]}"; do
        local name=${r%%|*} rest=${r#*|}
        local dir=${rest%%|*} pat=${rest#*|}
        while IFS= read -r f; do
            # Code lines only: comments and doc comments may name any layer.
            local n
            n=$(grep -vP '^\s*//' "$f" | grep -cP "$pat" || true)
            if [ "$n" -gt 0 ]; then
                out+="$name $f $n"$'\n'
            fi
        done < <(find "$dir" -name '*.rs' | sort)
    done
    printf '%s' "$out"
}

# Crates that must not reach DPDK (or dataplane) at all, by their dependency trees (Cargo.lock,
# no network), tests included; and the transport may use the simulator only in its tests and
# behind its `testkit` feature (the harness's pump, for dataplane's simulator runs).
crates_without_dpdk=(wire netsim transport cli verbs ferroce-ibverbs ferroce-c)

if [ "${1:-}" = "--print" ]; then
    count
    exit 0
fi

allow=scripts/layers.allow
now=$(count)
bad=0
# Every arrow now present must be allowed at least as many times.
while read -r name file n; do
    [ -z "$name" ] && continue
    a=$(awk -v r="$name" -v f="$file" '$1 == r && $2 == f {print $3}' "$allow")
    if [ -z "$a" ]; then
        echo "layers: $file breaks $name ($n lines); see ARCHITECTURE.md" >&2
        grep -vP '^\s*//' "$file" | grep -nP "$(printf '%s\n' "${rules[@]}" | awk -F'|' -v r="$name" '$1 == r {sub(/^[^|]*\|[^|]*\|/, ""); print}')" | head -5 >&2
        bad=1
    elif [ "$n" -gt "$a" ]; then
        echo "layers: $file breaks $name $n times, $a allowed; see ARCHITECTURE.md" >&2
        bad=1
    elif [ "$n" -lt "$a" ]; then
        echo "layers: $file breaks $name $n times now, $a allowed: lower the allowance in $allow" >&2
        bad=1
    fi
done <<< "$now"
# And every allowance must still be needed.
while read -r name file a; do
    case "$name" in ''|'#'*) continue ;; esac
    if ! grep -q "^$name $file " <<< "$now"; then
        echo "layers: $file no longer breaks $name: remove its line from $allow" >&2
        bad=1
    fi
done < "$allow"
for c in "${crates_without_dpdk[@]}"; do
    if cargo tree --offline -q -p "$c" -e normal,build,dev --prefix none 2>/dev/null \
        | grep -qE '^(dpdk-sys|dataplane) '; then
        echo "layers: crate $c depends on dpdk-sys or dataplane (cargo tree -p $c -i dpdk-sys)" >&2
        bad=1
    fi
done
if cargo tree --offline -q -p transport -e normal,build --prefix none 2>/dev/null \
    | grep -qE '^netsim '; then
    echo "layers: crate transport depends on netsim outside its tests and its testkit feature (cargo tree -p transport -i netsim)" >&2
    bad=1
fi
if [ "$bad" -ne 0 ]; then
    exit 1
fi
echo "layers: no arrow beyond the $(grep -cv '^#' "$allow") allowed in $allow; ${crates_without_dpdk[*]} need no DPDK"
