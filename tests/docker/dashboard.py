#!/usr/bin/env python3
"""Checks a Grafana dashboard against a live roced's /metrics.

  dashboard.py DASHBOARD.json METRICS|-      (METRICS: a file of /metrics text, - for stdin)

Every metric a panel's query names must be exposed by roced, and every label the query uses
(in a selector, in `by (...)`/`without (...)`, in label_values() or in the legend) must be on
that metric's series, but for the labels Prometheus adds when it scrapes (job, instance and the
compose file's node). Histograms' _bucket/_sum/_count series count as exposed with their family,
`le` as a label of _bucket. Exits 1 naming each query that fails; prints what was checked.
"""

import json
import re
import sys

SCRAPE_LABELS = {"job", "instance", "node"}


def exposed(text):
    """{metric name: set of label names} from the Prometheus text format."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        if not m:
            continue
        labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
        series.setdefault(m.group(1), set()).update(labels)
    return series


def queries(dash):
    """(where, text, legend) of every query: panel targets and template variables."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p.get("title", "?"), t.get("expr", ""), t.get("legendFormat", "")))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else (q or "")
            out.append((f"variable ${v['name']}", q, ""))
    return out


def check(expr, legend, series):
    """What is wrong with one query: [] when every metric and label it names exists."""
    problems = []
    # Grafana's own variables and intervals are not PromQL.
    e = re.sub(r"\$__\w+|\$\{?\w+\}?", "", expr)
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', e)
    metrics = [m for m in re.findall(r"\b(ferroce_[a-z0-9_]+)", e)]
    if not metrics:
        problems.append("names no ferroce metric")
    labels = set()
    for sel in re.findall(r"\{([^}]*)\}", e):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", sel))
    for grp in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", e):
        labels |= {l.strip() for l in grp.split(",") if l.strip()}
    m = re.search(r"label_values\(\s*[^,]*,\s*([a-zA-Z_]\w*)\s*\)", e)
    if m:
        labels.add(m.group(1))
    labels |= set(re.findall(r"\{\{\s*([a-zA-Z_]\w*)\s*\}\}", legend))
    have = set()
    for name in metrics:
        fam = series.get(name)
        if fam is None:
            problems.append(f"{name} is not in /metrics")
            continue
        have |= fam
    for l in sorted(labels - SCRAPE_LABELS):
        if l == "le" and any(n.endswith("_bucket") for n in metrics):
            continue
        if l not in have:
            problems.append(f"label {l!r} is on none of {', '.join(metrics)}")
    return metrics, labels, problems


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        dash = json.load(f)
    text = sys.stdin.read() if sys.argv[2] == "-" else open(sys.argv[2]).read()
    series = exposed(text)
    if not any(n.startswith("ferroce_") for n in series):
        sys.exit("dashboard check: the metrics text has no ferroce_ series")
    bad = 0
    names, labels = set(), set()
    qs = queries(dash)
    for where, expr, legend in qs:
        ms, ls, problems = check(expr, legend, series)
        names |= set(ms)
        labels |= ls
        for p in problems:
            print(f"{where}: {expr}: {p}", file=sys.stderr)
            bad += 1
    print(f"{len(qs)} queries, {len(names)} metrics, {len(labels)} labels checked against "
          f"{len(series)} exposed series names: {'all there' if not bad else f'{bad} problems'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
