#!/usr/bin/env python3
"""Writes UDP-4791 frames of the project's captures (tests/data/rxe/*.pcap) as seed files of the
`parse` fuzz target's corpus: up to 5 per capture and opcode, so every kind of packet is there
without thousands of near-copies; and every MAD (the payload of a UD SEND Only to QP 1) as a seed
of the `mad` target's. Reads classic pcap directly: no dependencies."""
import hashlib, pathlib, struct, sys

root = pathlib.Path(__file__).resolve().parent.parent
out = root / "fuzz" / "corpus" / "parse"
out.mkdir(parents=True, exist_ok=True)
mads = root / "fuzz" / "corpus" / "mad"
mads.mkdir(parents=True, exist_ok=True)
n = 0
per_kind = {}
for cap in sorted((root / "tests" / "data" / "rxe").glob("*.pcap")):
    data = cap.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(endian + "IIII", data[off:off + 16])
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        at = frame.find(b"\x12\xb7", 34, 60)  # UDP destination port 4791
        if at < 0 or at + 6 >= len(frame):
            continue
        kind = (cap.name, frame[at + 6])  # the BTH opcode follows the 8-byte UDP header
        # UD SEND Only (0x64) to QP 1: the MAD follows the BTH (12 bytes) and the DETH (8).
        if frame[at + 6] == 0x64 and frame[at + 11:at + 14] == b"\x00\x00\x01":
            mad = frame[at + 26:at + 26 + 256]
            p = mads / hashlib.sha1(mad).hexdigest()
            if len(mad) == 256 and not p.exists():
                p.write_bytes(mad)
                n += 1
        if per_kind.get(kind, 0) >= 5:
            continue
        per_kind[kind] = per_kind.get(kind, 0) + 1
        name = hashlib.sha1(frame).hexdigest()
        p = out / name
        if not p.exists():
            p.write_bytes(frame)
            n += 1
print(f"{n} new seeds in {out}", file=sys.stderr)
