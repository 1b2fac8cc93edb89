"""Linux Soft-RoCE peers for ferroce's interop suite.

A `Lab` is a private network namespace holding a Linux bridge, one QEMU VM per peer (Debian's
kernel with rdma_rxe as rxe0 on its eth0, built by setup.sh), and two veths for ferroce: one
that roced drives with net_af_packet (no kernel address, so the kernel never answers the
RoCE traffic), and one with a kernel address for the TCP connection exchanges of perftest
and ibv_*_pingpong. roced and rocectl run inside the namespace.

    lab.vm  10.234.0.11/24  fd00:234::11   (rxe0)
    roced   10.234.0.2/24   fd00:234::2    (net_af_packet on fxd0)
    kernel  10.234.0.1/24                  (fxh0: TCP to the VM)

Commands reach a VM over its second serial port (guest-init's protocol): a line
"ID BASE64-SCRIPT", answered by the output and "@@ID RC".
"""

import base64
import os
import secrets
import signal
import socket
import subprocess
import time

STATE = os.environ.get("FERROCE_INTEROP_STATE", "/var/tmp/ferroce-interop")
NS = os.environ.get("FERROCE_INTEROP_NS", "ferroce-ix")
NET = "10.234.0"
NET6 = "fd00:234:"
FERROCE_IP = NET + ".2"
FERROCE_IP6 = NET6 + ":2"
HOST_IP = NET + ".1"
FERROCE_MAC = "02:fe:00:00:00:02"


def sh(cmd, check=True):
    """Runs a host command; its output."""
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (cmd, r.returncode, r.stderr.strip()))
    return r.stdout


def nsx(cmd, check=True):
    return sh("ip netns exec %s %s" % (NS, cmd), check)


class Vm:
    """One peer VM."""

    def __init__(self, index, mtu):
        self.i = index
        self.name = "vm%d" % index
        self.ip = "%s.%d" % (NET, 11 + index)
        self.ip6 = "%s:%x" % (NET6, 0x11 + index)
        self.mac = "52:54:00:e9:01:%02x" % (0x11 + index)
        self.mtu = mtu
        self.work = os.path.join(STATE, "work")
        self.ctl = os.path.join(self.work, self.name + ".ctl")
        self.pidfile = os.path.join(self.work, self.name + ".pid")
        self.console = os.path.join(self.work, self.name + ".console")
        self.pid = None
        self.sock = None
        self.buf = b""

    def start(self):
        os.makedirs(self.work, exist_ok=True)
        for f in (self.ctl, self.pidfile, self.console):
            if os.path.exists(f):
                os.unlink(f)
        tap = "fxtap%d" % self.i
        nsx("ip tuntap add dev %s mode tap" % tap)
        nsx("ip link set %s mtu %d master fxbr0 up" % (tap, self.mtu))
        args = (
            "console=ttyS0 panic=-1 quiet peer.ip=%s/24 peer.ip6=%s/64 peer.mtu=%d"
            % (self.ip, self.ip6, self.mtu)
        )
        nsx(
            "qemu-system-x86_64 -accel tcg -cpu max -m 512 -smp 1 -nodefaults -no-user-config"
            " -display none -no-reboot -kernel %s/vmlinuz -initrd %s/initramfs.img"
            " -append '%s' -serial file:%s"
            " -chardev socket,id=ctl,path=%s,server=on,wait=off -serial chardev:ctl"
            " -netdev tap,id=n0,ifname=%s,script=no,downscript=no"
            " -device virtio-net-pci,netdev=n0,mac=%s,romfile="
            " -pidfile %s -daemonize"
            % (STATE, STATE, args, self.console, self.ctl, tap, self.mac, self.pidfile)
        )
        self.pid = int(open(self.pidfile).read().strip())

    def _connect(self, deadline):
        while self.sock is None:
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(self.ctl)
                self.sock = s
            except OSError:
                s.close()
                if time.time() > deadline:
                    raise
                time.sleep(0.2)

    def run(self, script, timeout=120):
        """Runs a dash script in the VM; (exit status, output)."""
        deadline = time.time() + timeout
        self._connect(deadline)
        cid = secrets.token_hex(6)
        line = "%s %s\n" % (cid, base64.b64encode(script.encode()).decode())
        self.sock.sendall(line.encode())
        end = ("@@%s " % cid).encode()
        self.sock.settimeout(0.5)
        while True:
            at = self.buf.find(end)
            if at >= 0:
                nl = self.buf.find(b"\n", at)
                if nl >= 0:
                    out = self.buf[:at]
                    rc = int(self.buf[at + len(end):nl].strip() or b"255")
                    self.buf = self.buf[nl + 1:]
                    return rc, out.decode(errors="replace").replace("\r", "")
            if time.time() > deadline:
                raise TimeoutError("%s: no answer in %ds to: %s" % (self.name, timeout, script))
            try:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise RuntimeError("%s: control port closed" % self.name)
                self.buf += chunk
            except socket.timeout:
                pass

    def wait_ready(self, timeout=240):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                rc, out = self.run("cat /sys/class/infiniband/rxe0/ports/1/state", 10)
                if rc == 0 and "ACTIVE" in out:
                    return
            except (OSError, TimeoutError):
                pass
            time.sleep(0.5)
        tail = open(self.console, errors="replace").read()[-2000:] if os.path.exists(self.console) else ""
        raise RuntimeError("%s: rxe0 not ACTIVE in %ds; console:\n%s" % (self.name, timeout, tail))

    def nic_stalled(self):
        """True once the guest's kernel has reported its NIC's transmit queue stuck: QEMU's
        virtio-net under TCG stopped taking the guest's frames (seen once in CI, 37 s into a
        run, the VM unreachable from then on). The guest cannot recover from it by itself."""
        try:
            with open(self.console, errors="replace") as f:
                return "NETDEV WATCHDOG" in f.read()
        except OSError:
            return False

    def restart(self):
        """A fresh VM in place of this one (same addresses; a new console log)."""
        self.stop()
        nsx("ip link del fxtap%d" % self.i, check=False)
        self.start()
        self.wait_ready()

    def stop(self):
        if self.sock:
            self.sock.close()
            self.sock = None
        if self.pid:
            try:
                cmdline = open("/proc/%d/cmdline" % self.pid, "rb").read()
                if b"qemu" in cmdline:
                    os.kill(self.pid, signal.SIGTERM)
                    for _ in range(50):
                        os.kill(self.pid, 0)
                        time.sleep(0.1)
            except (OSError, ProcessLookupError):
                pass
            self.pid = None


class Lab:
    """The namespace, its bridge, the VMs and ferroce's two veths."""

    def __init__(self, vms=1, mtu=1500):
        self.mtu = mtu
        self.vms = [Vm(i, mtu) for i in range(vms)]

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        for f in ("vmlinuz", "initramfs.img"):
            if not os.path.exists(os.path.join(STATE, f)):
                raise RuntimeError("run tests/interop/setup.sh first (%s/%s is missing)" % (STATE, f))
        if NS in sh("ip netns list"):
            sh("ip netns del %s" % NS)
        sh("ip netns add %s" % NS)
        nsx("ip link set lo up")
        # A new namespace takes IPv4 forwarding from the host's (a Docker engine sets it to 1);
        # forwarding here would route the frames the VM sends to ferroce's MAC on fxd0 back out
        # through fxh0 to ferroce again, once per TTL: the lab's kernel does not route.
        nsx("sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0")
        # No netfilter on the bridge's frames, whatever the host's firewall and br_netfilter
        # (a Docker engine's rules, say).
        nsx("ip link add fxbr0 type bridge stp_state 0 forward_delay 0 "
            "nf_call_iptables 0 nf_call_ip6tables 0 nf_call_arptables 0")
        nsx("ip link set fxbr0 mtu %d up" % self.mtu)
        for v, addr in (("fxd0", None), ("fxh0", HOST_IP + "/24")):
            nsx("ip link add %s type veth peer name %sbr" % (v, v))
            nsx("ip link set %sbr mtu %d master fxbr0 up" % (v, self.mtu))
            nsx("sysctl -qw net.ipv6.conf.%s.disable_ipv6=1" % v)
            if addr:
                nsx("ip addr add %s dev %s" % (addr, v))
            else:
                nsx("ip link set %s address %s" % (v, FERROCE_MAC))
            nsx("ip link set %s mtu %d up" % (v, self.mtu))
        for vm in self.vms:
            vm.start()
        for vm in self.vms:
            vm.wait_ready()

    def stop(self):
        for vm in self.vms:
            vm.stop()
        if NS in sh("ip netns list", check=False):
            sh("ip netns del %s" % NS, check=False)
