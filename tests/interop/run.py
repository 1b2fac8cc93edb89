#!/usr/bin/env python3
"""ferroce against Linux Soft-RoCE: unmodified perftest in a VM, rocectl perf on roced.

usage: run.py [--only SUBSTRING] [--keep-logs DIR]

Boots one peer VM (peer.Lab), starts roced on net_af_packet in the lab's namespace, and runs
each case in both roles (ferroce as perftest client against the VM's server, and the VM's
perftest client against `rocectl perf --server`). A case passes when both sides exit 0 and
report the same message size and iteration count with a non-zero bandwidth. Prints one line
per case, then the tools' own output for every case; exits 1 if any case failed.

Needs root, tests/interop/setup.sh done, and roced/rocectl built (ROCED / ROCECTL, default
target/release, else target/debug).
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def binary(name):
    env = os.environ.get(name.upper())
    if env:
        return os.path.abspath(env)
    for kind in ("release", "debug"):
        p = os.path.join(ROOT, "target", kind, name)
        if os.path.exists(p):
            return p
    sys.exit("run.py: build %s first (cargo build --release)" % name)


ROCED = binary("roced")
ROCECTL = binary("rocectl")
API = "127.0.0.1:7480"

CONFIG = """[eal]
file_prefix = "ferroce-interop-%d"
[dataplane]
lcores = [1]
mbufs = 8191
idle_sleep_us = 20
[[ports]]
device = "net_af_packet0,iface=fxd0"
mtu = %d
addresses = ["%s/24", "%s/64"]
probes = ["%s"]
[api]
listen = "%s"
"""

# (name, perftest tool and flags, rocectl perf arguments)
CASES = [
    ("write_bw 4KiB", "ib_write_bw -s 4096 -n 500", "write bw -s 4096 -n 500"),
    ("write_bw 64KiB", "ib_write_bw -s 65536 -n 100", "write bw -s 65536 -n 100"),
    ("write_bw 1B", "ib_write_bw -s 1 -n 500", "write bw -s 1 -n 500"),
    ("read_bw 4KiB", "ib_read_bw -s 4096 -n 500", "read bw -s 4096 -n 500"),
    ("send_bw 4KiB", "ib_send_bw -s 4096 -n 500", "send bw -s 4096 -n 500"),
    ("atomic_bw fetch-add", "ib_atomic_bw -A FETCH_AND_ADD -n 500", "atomic bw -A fetch-add -n 500"),
    ("atomic_bw cmp-swap", "ib_atomic_bw -A CMP_AND_SWAP -n 500", "atomic bw -A cmp-swap -n 500"),
    ("write_lat 8B", "ib_write_lat -s 8 -n 300", "write lat -s 8 -n 300"),
    ("write_lat 4KiB", "ib_write_lat -s 4096 -n 200", "write lat -s 4096 -n 200"),
    ("read_lat 8B", "ib_read_lat -s 8 -n 300", "read lat -s 8 -n 300"),
    ("send_lat 8B", "ib_send_lat -s 8 -n 300", "send lat -s 8 -n 300"),
    ("atomic_lat fetch-add", "ib_atomic_lat -A FETCH_AND_ADD -n 300", "atomic lat -A fetch-add -n 300"),
    ("rc_pingpong 4KiB", "ibv_rc_pingpong -s 4096 -n 200", "pingpong -s 4096 -n 200"),
    ("rc_pingpong 1B", "ibv_rc_pingpong -s 1 -n 200", "pingpong -s 1 -n 200"),
]

# Flags every tool gets: the device and GID index 1 (::ffff:IPv4), as rxe numbers them.
PERFTEST_FLAGS = " -d rxe0 -x 1 -F"
PINGPONG_FLAGS = " -d rxe0 -g 1"
PINGPONG = re.compile(r"^(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter", re.M)

def result(out):
    """The figures of perftest's result line (the line after the '#bytes' header):
    bandwidth: bytes, iterations, peak, average, msg rate; latency: bytes, iterations, t_min,
    t_max, t_typical, t_avg, t_stdev, 99%, 99.9%. None when there is none."""
    lines = out.splitlines()
    for i, l in enumerate(lines):
        if "#bytes" in l and i + 1 < len(lines):
            try:
                return tuple(float(x) for x in lines[i + 1].split())
            except ValueError:
                return None
    return None


class Roced:
    def __init__(self, logdir, mtu):
        self.cfg = os.path.join(logdir, "roced.toml")
        self.log = os.path.join(logdir, "roced.log")
        with open(self.cfg, "w") as f:
            f.write(CONFIG % (os.getpid(), mtu, peer.FERROCE_IP, peer.FERROCE_IP6,
                              peer.NET + ".11", API))
        self.p = subprocess.Popen(
            ["ip", "netns", "exec", peer.NS, ROCED, "--config", self.cfg,
             "--report", os.path.join(logdir, "roced.json")],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"), stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError("roced exited: " + open(self.log).read()[-3000:])
            r = ctl("port show --json", check=False)
            if r.returncode == 0 and '"link_up":true' in r.stdout.replace(" ", ""):
                return
            time.sleep(0.3)
        raise RuntimeError("roced's port did not come up: " + open(self.log).read()[-3000:])

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def ctl(args, check=True, timeout=300):
    cmd = "ip netns exec %s %s --api %s %s" % (peer.NS, ROCECTL, API, args)
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (cmd, r.stderr))
    return r


def vm_server(vm, tool):
    vm.run("rm -f /tmp/srv.log; setsid sh -c '%s > /tmp/srv.log 2>&1; echo EXIT=$? >> /tmp/srv.log' &" % tool)
    for _ in range(60):
        rc, _ = vm.run("netstat -ltn | grep -q ':18515 ' || grep -q '^EXIT=' /tmp/srv.log", 10)
        if rc == 0:
            return
        time.sleep(0.3)


def vm_server_result(vm):
    for _ in range(120):
        rc, out = vm.run("grep -q '^EXIT=' /tmp/srv.log && cat /tmp/srv.log", 10)
        if rc == 0:
            return out
        time.sleep(0.5)
    vm.run("kill $(pidof ib_write_bw ib_read_bw ib_atomic_bw ib_send_bw ib_write_lat"
           " ib_read_lat ib_send_lat ib_atomic_lat ibv_rc_pingpong) 2>/dev/null")
    return vm.run("cat /tmp/srv.log; echo EXIT=killed")[1]


def exit_of(out):
    m = re.search(r"^EXIT=(\S+)", out, re.M)
    return m.group(1) if m else "?"


def check(client, server, lat, pingpong=False):
    """The client's result line shows traffic, and the server's (where perftest prints one:
    not the servers of READ and ATOMIC latency) agrees on size and iterations. For
    rc_pingpong: both sides print the same number of iterations."""
    if pingpong:
        mc, ms = PINGPONG.search(client), PINGPONG.search(server)
        if not mc or not ms:
            return False, "no 'iters in ... usec/iter' line"
        if mc.group(1) != ms.group(1):
            return False, "sides disagree: %s vs %s iterations" % (mc.group(1), ms.group(1))
        return True, "%s iters: %s usec/iter" % (mc.group(1), mc.group(3))
    rc, rs = result(client), result(server)
    if not rc or len(rc) < 5:
        return False, "no result line from the client"
    if rs and rs[:2] != rc[:2]:
        return False, "sides disagree: %s vs %s" % (rc[:2], rs[:2])
    if lat:
        if len(rc) != 9 or not 0 < rc[2] <= rc[4] <= rc[3]:
            return False, "latency figures out of order: %s" % (rc,)
        return True, "%d B x %d: typical %.1f us, 99%% %.1f us" % (rc[0], rc[1], rc[4], rc[7])
    if not rs:
        return False, "no result line from the server"
    if rc[3] <= 0:
        return False, "zero bandwidth"
    return True, "%d B x %d: %.2f MB/s, %.4f Mpps" % (rc[0], rc[1], rc[3], rc[4])


def main():
    only = None
    if "--only" in sys.argv:
        only = sys.argv[sys.argv.index("--only") + 1]
    logdir = tempfile.mkdtemp(prefix="ferroce-interop-")
    if "--keep-logs" in sys.argv:
        logdir = sys.argv[sys.argv.index("--keep-logs") + 1]
        os.makedirs(logdir, exist_ok=True)
    rows, details = [], []
    t0 = time.time()
    with peer.Lab(vms=1) as lab:
        vm = lab.vms[0]
        print("peer %s up (rxe0 ACTIVE) after %.1fs" % (vm.ip, time.time() - t0), flush=True)
        roced = Roced(logdir, 1500)
        try:
            for name, tool, perf in CASES:
                if only and only not in name:
                    continue
                pingpong = tool.startswith("ibv_rc_pingpong")
                flags = PINGPONG_FLAGS if pingpong else PERFTEST_FLAGS
                ctl_cmd = perf if pingpong else "perf " + perf
                # ferroce is the client, the VM serves.
                vm_server(vm, tool + flags)
                c = ctl("%s %s --timeout 60" % (ctl_cmd, vm.ip), check=False)
                s = vm_server_result(vm)
                lat = "_lat" in name
                ok = c.returncode == 0 and exit_of(s) == "0"
                ok2, why = check(c.stdout, s, lat, pingpong) if ok else (False, "exit %d / %s: %s" % (
                    c.returncode, exit_of(s), c.stderr.strip()[-300:]))
                rows.append((name, "ferroce client -> rxe server", ok and ok2, why))
                details.append((name + ", ferroce client", c.stdout + c.stderr, s))
                if pingpong:
                    # rc_pingpong's server may still be closing its TCP socket.
                    time.sleep(0.5)
                # The VM is the client, ferroce serves.
                srv = subprocess.Popen(
                    "ip netns exec %s %s --api %s %s --server --timeout 60"
                    % (peer.NS, ROCECTL, API, ctl_cmd),
                    shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for _ in range(100):
                    if ":18515 " in peer.nsx("ss -ltn", check=False):
                        break
                    time.sleep(0.1)
                rc, cout = vm.run("timeout 90 %s%s %s; echo EXIT=$?" % (tool, flags, peer.HOST_IP), 120)
                try:
                    sout = srv.communicate(timeout=30)[0]
                except subprocess.TimeoutExpired:
                    srv.kill()
                    sout = srv.communicate()[0] + "\n(rocectl killed: no exit)"
                ok = srv.returncode == 0 and exit_of(cout) == "0"
                ok2, why = check(cout, sout, lat, pingpong) if ok else (False, "exit %s / %s" % (
                    exit_of(cout), srv.returncode))
                rows.append((name, "rxe client -> ferroce server", ok and ok2, why))
                details.append((name + ", rxe client", sout, cout))
        finally:
            roced.stop()
    width = max(len(r[0]) for r in rows) if rows else 10
    print()
    print("%-*s  %-30s  %-4s  %s" % (width, "case", "roles", "", "figures"))
    for name, roles, ok, why in rows:
        print("%-*s  %-30s  %-4s  %s" % (width, name, roles, "PASS" if ok else "FAIL", why))
    failed = sum(1 for r in rows if not r[2])
    print("\n%d passed, %d failed in %.0fs; roced's log and report: %s" % (
        len(rows) - failed, failed, time.time() - t0, logdir))
    for name, ferroce_out, rxe_out in details:
        print("\n===== %s\n----- ferroce (rocectl perf)\n%s\n----- rxe (perftest in the VM)\n%s" % (
            name, ferroce_out.strip(), rxe_out.strip()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
