#!/usr/bin/env python3
"""Cross-check of ferroce's RoCEv2 wire code against an independent implementation, scapy's
RoCE layer (scapy.contrib.roce), which computes the ICRC its own way.

  scapy_crosscheck.py build OUT.pcap   scapy builds packets (ICRC by scapy); prints what it built
                                       as JSON lines, for ferroce to parse and compare
  scapy_crosscheck.py check IN.pcap    for every RoCEv2 packet of IN (built by ferroce), scapy
                                       recomputes the ICRC; prints a JSON summary; exits 1 on any
                                       mismatch
"""
import json
import struct
import sys

from scapy.all import IP, UDP, Dot1Q, Ether, IPv6, Raw, rdpcap, raw, wrpcap
from scapy.contrib.roce import AETH, BTH, cnp


def reth(va, rkey, length):
    return Raw(struct.pack("!QII", va, rkey, length))


def build(path):
    a, b = "10.99.0.1", "10.99.0.2"
    a6, b6 = "fd99::1", "fd99::2"
    l2 = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    v4 = IP(src=a, dst=b, flags="DF", ttl=64, tos=(26 << 2) | 2)
    v4ce = IP(src=a, dst=b, flags="DF", ttl=64, tos=(26 << 2) | 3)
    v6 = IPv6(src=a6, dst=b6, hlim=64, tc=(26 << 2) | 2)
    u = UDP(sport=0xC123, dport=4791, chksum=0)
    pay = bytes(range(64))
    pkts = [
        (l2 / v4 / u / BTH(opcode=0x04, dqpn=0x11, psn=100, ackreq=1) / Raw(pay),
         {"opcode": 0x04, "dest_qp": 0x11, "psn": 100, "payload_len": 64, "ecn": "ECT(0)"}),
        (l2 / v4 / u / BTH(opcode=0x11, dqpn=0x22, psn=101) / AETH(syndrome=0x1F, msn=5),
         {"opcode": 0x11, "dest_qp": 0x22, "psn": 101, "aeth": 0x1F}),
        (l2 / v4 / u / BTH(opcode=0x11, dqpn=0x22, psn=102) / AETH(syndrome=0x60, msn=5),
         {"opcode": 0x11, "dest_qp": 0x22, "psn": 102, "aeth": 0x60}),
        (l2 / v4 / u / BTH(opcode=0x11, dqpn=0x22, psn=103) / AETH(syndrome=0x2C, msn=5),
         {"opcode": 0x11, "dest_qp": 0x22, "psn": 103, "aeth": 0x2C}),
        (l2 / v4ce / u / BTH(opcode=0x06, dqpn=0x33, psn=7) / reth(0x1000, 0xABCD, 4096) / Raw(pay * 16),
         {"opcode": 0x06, "dest_qp": 0x33, "psn": 7, "payload_len": 1024, "ecn": "CE", "rkey": 0xABCD}),
        (l2 / v4 / u / cnp(0x44), {"opcode": 0x81, "dest_qp": 0x44, "becn": True}),
        (l2 / v6 / u / BTH(opcode=0x04, dqpn=0x55, psn=1) / Raw(pay), {"opcode": 0x04, "dest_qp": 0x55, "psn": 1, "ipv6": True}),
        (l2 / v6 / u / BTH(opcode=0x11, dqpn=0x55, psn=2) / AETH(syndrome=0x1F, msn=1), {"opcode": 0x11, "dest_qp": 0x55, "ipv6": True}),
        (Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / Dot1Q(vlan=100, prio=3) / v4 / u
         / BTH(opcode=0x04, dqpn=0x66, psn=9) / Raw(pay), {"opcode": 0x04, "dest_qp": 0x66, "vlan": 100}),
        # Payload not a multiple of 4: pad count 2 and two pad bytes.
        (l2 / v4 / u / BTH(opcode=0x04, dqpn=0x77, psn=3, padcount=2) / Raw(pay[:62] + b"\0\0"),
         {"opcode": 0x04, "dest_qp": 0x77, "payload_len": 62}),
    ]
    wrpcap(path, [p for p, _ in pkts])
    for _, want in pkts:
        print(json.dumps(want))


def check(path):
    n = bad = 0
    for p in rdpcap(path):
        if BTH not in p:
            continue
        n += 1
        want = bytes(raw(p)[-4:])
        q = p.copy()
        q[BTH].icrc = None
        got = bytes(raw(q)[-4:])
        if got != want:
            bad += 1
            print(json.dumps({"mismatch": n, "carried": want.hex(), "scapy": got.hex()}), file=sys.stderr)
    print(json.dumps({"roce": n, "icrc_mismatch": bad}))
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("build", "check"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "build":
        build(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2]))
