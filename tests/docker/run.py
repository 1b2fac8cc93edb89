#!/usr/bin/env python3
"""ferroce in containers, as `make test` runs it (root, Debian 12, no container registry needed).

Starts the Docker engine when none answers (scripts/docker-engine.sh: Debian's docker.io, with
the host's firewall left alone), builds the base images from Debian's packages (docker/base.sh),
builds ferroce's images, brings docker/compose.yaml up (two roced nodes on memif, Prometheus, the
demo job), then checks:
  - the job's WRITE/READ/SEND/atomic results, read back and compared by scripts/demo.sh;
  - Prometheus's HTTP API: ferroce_sent_pkts_total > 0 for node a and node b;
  - the Grafana dashboard's metrics and labels exist in node A's live /metrics;
  - `docker-compose down -v` leaves no container, volume, memif socket or hugepage behind.
Prints how long each step took. Stops the engine again if it started it.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKER = "/usr/bin/docker"
PROJECT = "ferroce-test"
COMPOSE_FILE = os.path.join(ROOT, "docker", "compose.yaml")
TOKEN = "ferroce-compose-demo-token"
PORTS = {"FERROCE_A_PORT": "17470", "FERROCE_B_PORT": "17471", "FERROCE_PROMETHEUS_PORT": "19090"}
ENV = dict(
    os.environ,
    FERROCE_BASE="ferroce/debian:bookworm-slim",
    FERROCE_RUST="ferroce/rust:bookworm",
    FERROCE_TAG="test",
    **PORTS,
)

steps = []


def step(name):
    """Times a step: `with step("..."):`."""

    class Timer:
        def __enter__(self):
            self.t0 = time.monotonic()
            print(f"== {name}", flush=True)

        def __exit__(self, *exc):
            dt = time.monotonic() - self.t0
            steps.append((name, dt, exc[0] is None))
            print(f"   {'done' if exc[0] is None else 'FAILED'} in {dt:.1f} s", flush=True)

    return Timer()


def run(cmd, check=True, capture=False, **kw):
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, text=True, capture_output=capture, **kw)
    if check and r.returncode != 0:
        out = (r.stdout or "") + (r.stderr or "") if capture else ""
        raise SystemExit(f"docker test: {' '.join(cmd)} exited {r.returncode}\n{out}")
    return r


def compose(*args, **kw):
    return run(["docker-compose", "-f", COMPOSE_FILE, "-p", PROJECT, *args], **kw)


def http_text(url, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.read().decode()


def http_json(url, token=None):
    return json.loads(http_text(url, token))


def prometheus(path, query=None):
    """Prometheus's HTTP API on the published port: /api/v1/PATH, with a PromQL query."""
    q = f"?query={urllib.parse.quote(query)}" if query else ""
    return http_json(f"http://127.0.0.1:{PORTS['FERROCE_PROMETHEUS_PORT']}/api/v1/{path}{q}")


def hugepages_free():
    with open("/proc/meminfo") as f:
        return int(re.search(r"^HugePages_Free:\s+(\d+)", f.read(), re.M).group(1))


def leftovers():
    """What of this project is on the host: containers, volumes, hugetlbfs mounts of its volumes."""
    label = f"label=com.docker.compose.project={PROJECT}"
    cs = run([DOCKER, "ps", "-aq", "--filter", label], capture=True).stdout.split()
    vs = run([DOCKER, "volume", "ls", "-q", "--filter", label], capture=True).stdout.split()
    with open("/proc/mounts") as f:
        mounts = [l.split()[1] for l in f if f"/volumes/{PROJECT}_" in l]
    return cs, vs, mounts


def prometheus_sent(node):
    res = prometheus("query", f'sum(ferroce_sent_pkts_total{{node="{node}"}})')["data"]["result"]
    return float(res[0]["value"][1]) if res else None


def main():
    started = None
    with step("Docker engine (scripts/docker-engine.sh start)"):
        out = run(["bash", "scripts/docker-engine.sh", "start"], capture=True).stdout.strip()
        print("   " + "\n   ".join(out.splitlines()))
        last = out.splitlines()[-1]
        if last.startswith("started"):
            started = last.split()[1]
    try:
        test()
    finally:
        compose("down", "-v", "--remove-orphans", check=False, capture=True)
        if started:
            with step(f"stop the Docker engine this test started (pid {started})"):
                run(["bash", "scripts/docker-engine.sh", "stop"])
        print("\n== step timings")
        for name, dt, ok in steps:
            print(f"   {dt:7.1f} s  {'ok  ' if ok else 'FAIL'} {name}")


def test():
    with step("base images from Debian's packages, no registry (docker/base.sh)"):
        run(["bash", "docker/base.sh"])
    with step("images: ferroce/roced, ferroce/demo, ferroce/prometheus (docker-compose build)"):
        compose("build", "-q", "--force-rm", capture=True)
        for img in ("roced", "demo", "prometheus"):
            size = run([DOCKER, "image", "inspect", "-f", "{{.Size}}", f"ferroce/{img}:test"],
                       capture=True).stdout.strip()
            print(f"   ferroce/{img}:test {int(size) / 1e6:.0f} MB")

    # The image's own content: what an operator runs by hand.
    r = run([DOCKER, "run", "--rm", "--entrypoint", "roced", "ferroce/roced:test", "--version"],
            capture=True)
    print(f"   roced --version in the image: {r.stdout.strip()}")
    r = run([DOCKER, "run", "--rm", "--entrypoint", "bash", "ferroce/roced:test", "-c",
             "ls /usr/local/lib/ferroce/libferroce_ibverbs.so && ldd /usr/local/bin/roced | grep -c 'not found' || true"],
            capture=True)
    lines = r.stdout.split()
    assert lines[0] == "/usr/local/lib/ferroce/libferroce_ibverbs.so" and lines[1] == "0", r.stdout

    free_before = hugepages_free()
    run_dir_before = set(os.listdir("/run/ferroce")) if os.path.isdir("/run/ferroce") else set()
    assert leftovers() == ([], [], []), f"containers of {PROJECT} before the test: {leftovers()}"

    with step("docker-compose up: nodes healthy, then Prometheus, then the demo job"):
        compose("up", "-d", capture=True)
        demo = compose("ps", "-q", "demo", capture=True).stdout.strip()
        assert demo, "no demo container"
    with step("the demo job's RDMA operations (scripts/demo.sh against both APIs)"):
        try:
            code = run([DOCKER, "wait", demo], capture=True, timeout=300).stdout.strip()
        except subprocess.TimeoutExpired:
            log = run([DOCKER, "logs", demo], capture=True, check=False)
            raise SystemExit(f"docker test: the demo job still runs after 300 s:\n{log.stdout}{log.stderr}")
        log = run([DOCKER, "logs", demo], capture=True)
        text = log.stdout + log.stderr
        print("   | " + "\n   | ".join(text.rstrip().splitlines()))
        if code != "0":
            print(compose("logs", "--no-color", "node-a", "node-b", capture=True, check=False).stdout)
            raise SystemExit(f"docker test: the demo job exited {code}")
        oks = [l for l in text.splitlines() if l.strip().startswith("ok:")]
        # 2 x (WRITE, READ) + SEND + fetch-add + compare-swap
        assert len(oks) == 7 and "MISMATCH" not in text, f"{len(oks)} checks passed:\n{text}"
        print(f"   {len(oks)} results read back and compared")

    with step("Prometheus's /api/v1/query: ferroce_sent_pkts_total > 0 for both nodes"):
        deadline = time.monotonic() + 30
        while True:
            got = {n: prometheus_sent(n) for n in ("a", "b")}
            if all(v and v > 0 for v in got.values()):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"docker test: Prometheus has ferroce_sent_pkts_total {got}")
            time.sleep(1)
        print(f"   ferroce_sent_pkts_total: node a {got['a']:.0f}, node b {got['b']:.0f}")
        targets = prometheus("targets")
        health = sorted((t["labels"]["node"], t["health"]) for t in targets["data"]["activeTargets"])
        assert health == [("a", "up"), ("b", "up")], health

    with step("the Grafana dashboard's queries against node A's live /metrics and Prometheus"):
        metrics = http_text(f"http://127.0.0.1:{PORTS['FERROCE_A_PORT']}/metrics", TOKEN)
        board = os.path.join(ROOT, "docker", "grafana", "ferroce.json")
        checker = os.path.join(ROOT, "tests", "docker", "dashboard.py")
        r = subprocess.run([sys.executable, checker, board, "-"], input=metrics, text=True,
                           capture_output=True)
        print("   " + "\n   ".join(r.stdout.rstrip().splitlines()))
        if r.returncode != 0:
            raise SystemExit(f"docker test: dashboard check failed\n{r.stderr}")
        # The checker can fail: a misspelt metric and label are caught.
        with open(board) as f:
            wrong = f.read().replace("ferroce_rcvd_pkts_total", "ferroce_rcvd_packets_total")
        wrong = wrong.replace("by (instance, state)", "by (instance, qp_state)")
        bad_board = os.path.join(ROOT, "target", "dashboard-misspelt.json")
        with open(bad_board, "w") as f:
            f.write(wrong)
        r = subprocess.run([sys.executable, checker, bad_board, "-"], input=metrics, text=True,
                           capture_output=True)
        assert r.returncode == 1 and "ferroce_rcvd_packets_total is not in /metrics" in r.stderr \
            and "'qp_state' is on none of ferroce_qps" in r.stderr, r.stderr
        # Each query, with Grafana's variables filled in, is PromQL Prometheus evaluates to
        # series, once it has scraped both nodes a few times (rates need two samples).
        deadline = time.monotonic() + 30
        while True:
            v = prometheus("query", 'min(count_over_time(up{job="roced"}[1m]))')
            res = v["data"]["result"]
            if res and float(res[0]["value"][1]) >= 4:
                break
            assert time.monotonic() < deadline, f"Prometheus scraped too few times: {v}"
            time.sleep(1)
        sys.path.insert(0, os.path.dirname(checker))
        import dashboard
        with open(board) as f:
            qs = dashboard.queries(json.load(f))
        empty = []
        for where, expr, _ in qs:
            if expr.startswith("label_values("):
                expr = "group by (instance) (" + expr[len("label_values("):].split(",")[0] + ")"
            expr = expr.replace("$__rate_interval", "30s").replace("$instance", ".*")
            v = prometheus("query", expr)
            assert v["status"] == "success", (where, expr, v)
            if not v["data"]["result"]:
                empty.append(where)
        assert not empty, f"dashboard queries Prometheus has no series for: {sorted(set(empty))}"
        print(f"   {len(qs)} queries evaluated by Prometheus, each to series")

    with step("docker-compose down -v: nothing left behind"):
        compose("down", "-v", capture=True)
        cs, vs, mounts = leftovers()
        assert not cs and not vs and not mounts, f"left: containers {cs}, volumes {vs}, mounts {mounts}"
        run_dir_after = set(os.listdir("/run/ferroce")) if os.path.isdir("/run/ferroce") else set()
        assert run_dir_after <= run_dir_before, f"new in /run/ferroce: {run_dir_after - run_dir_before}"
        free_after = hugepages_free()
        assert free_after == free_before, f"hugepages free: {free_before} before, {free_after} after"
        print(f"   no containers, volumes or mounts of {PROJECT}; hugepages free {free_after} "
              f"as before; no new files in /run/ferroce")


if __name__ == "__main__":
    # Stopped by make or CI (SIGTERM): still bring the project down and stop the engine.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
    print("docker test: passed")
