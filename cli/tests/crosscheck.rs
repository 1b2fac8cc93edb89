//! Cross-check against independent implementations: scapy's RoCE layer builds packets that
//! ferroce must parse with the same ICRC (and the same fields); ferroce builds a packet for every
//! opcode it knows, over IPv4, IPv6 and 802.1Q, whose ICRC scapy must recompute identically and
//! which tshark must dissect as InfiniBand with no malformed or warning-level expert items.
//!
//! Needs python3 with scapy and tshark (scripts/setup.sh installs both).

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use wire::PacketBuf;
use wire::buf::HeapBuf;
use wire::ipv4::{self, Ecn};
use wire::opcode::{OPCODES, mask};
use wire::packet::{ExtRepr, IpRepr, RoceRepr, build};
use wire::{Psn, aeth, atomic_ack_eth, atomic_eth, bth, deth, eth, ipv6, reth, udp};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferroce-xcheck-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (scripts/setup.sh installs scapy and tshark)"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One packet of every opcode in the table, in three encapsulations; returns what was built.
fn ferroce_packets() -> Vec<(u8, &'static str, Vec<u8>)> {
    let mut v = Vec::new();
    for (opcode, info) in OPCODES.iter().enumerate() {
        if !info.is_valid() {
            continue;
        }
        for encap in ["ipv4", "ipv6", "vlan"] {
            let ip = if encap == "ipv6" {
                IpRepr::V6(ipv6::Repr {
                    traffic_class: 26 << 2 | 2,
                    flow_label: 0,
                    next_header: ipv4::PROTO_UDP,
                    hop_limit: 64,
                    src: "fd99::1".parse().unwrap(),
                    dst: "fd99::2".parse().unwrap(),
                })
            } else {
                IpRepr::V4(ipv4::Repr {
                    dscp: 26,
                    ecn: Ecn::Ect0,
                    ident: 0,
                    flags_frag: 0x4000,
                    ttl: 64,
                    protocol: ipv4::PROTO_UDP,
                    src: "10.99.0.1".parse().unwrap(),
                    dst: "10.99.0.2".parse().unwrap(),
                })
            };
            let has = |m| info.has(m);
            let repr = RoceRepr {
                eth: eth::Repr {
                    dst: [2, 0, 0, 0, 0, 2],
                    src: [2, 0, 0, 0, 0, 1],
                    vlan: (encap == "vlan").then_some(eth::VlanTag {
                        pcp: 3,
                        dei: false,
                        vid: 100,
                    }),
                    ethertype: 0,
                },
                ip,
                udp: udp::Repr {
                    src_port: udp::source_port_for_qp(0x11, 0x12),
                    dst_port: udp::ROCEV2_PORT,
                    checksum: 0,
                },
                bth: bth::Repr {
                    opcode: opcode as u8,
                    pkey: bth::DEFAULT_PKEY,
                    becn: has(mask::CNP),
                    dest_qp: 0x12,
                    ack_req: has(mask::REQ),
                    psn: Psn::new(0x00ab_cdef),
                    ..Default::default()
                },
                ext: ExtRepr {
                    deth: has(mask::DETH).then_some(deth::Repr {
                        qkey: 0x1111_1111,
                        resv8: 0,
                        src_qp: 0x11,
                    }),
                    reth: has(mask::RETH).then_some(reth::Repr {
                        va: 0x7f00_0000_1000,
                        rkey: 0x1234,
                        dma_len: 64,
                    }),
                    atomic_eth: has(mask::ATMETH).then_some(atomic_eth::Repr {
                        va: 0x7f00_0000_2000,
                        rkey: 0x1234,
                        swap_add: 1,
                        compare: 0,
                    }),
                    aeth: has(mask::AETH).then_some(aeth::Repr {
                        syndrome: aeth::Syndrome::Ack { credits: 31 },
                        msn: 1,
                    }),
                    atomic_ack: has(mask::ATMACK).then_some(atomic_ack_eth::Repr { orig: 41 }),
                    immdt: has(mask::IMMDT).then_some(0xdead_beef),
                    ieth: has(mask::IETH).then_some(0x4321),
                },
            };
            // 64 bytes of payload where the opcode carries one (tshark's RPC-over-RDMA
            // heuristic misreads 0- and 4-byte SENDs), none otherwise.
            let payload: Vec<u8> = if has(mask::PAYLOAD) {
                (0..64).collect()
            } else {
                vec![]
            };
            let mut b = HeapBuf::from_slice(&payload);
            build(&mut b, &repr, false).unwrap();
            v.push((opcode as u8, encap, b.data().to_vec()));
        }
    }
    v
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let f = std::fs::File::create(path).unwrap();
    let mut w = PcapWriter::with_header(f, PcapHeader::default()).unwrap();
    for (i, fr) in frames.iter().enumerate() {
        w.write_packet(&PcapPacket::new(
            Duration::from_micros(i as u64),
            fr.len() as u32,
            fr,
        ))
        .unwrap();
    }
}

#[test]
fn scapy_built_packets_parse_with_the_same_icrc_and_fields() {
    let dir = tmp("scapy");
    let pcap = dir.join("scapy.pcap");
    let script = root().join("tests/interop/scapy_crosscheck.py");
    let (code, stdout, stderr) = run(Command::new("python3").arg(&script).arg("build").arg(&pcap));
    assert_eq!(code, 0, "{stderr}");
    let want: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (code, out, err) = run(Command::new(env!("CARGO_BIN_EXE_rocectl"))
        .args(["decode", "--verify-icrc", "--json"])
        .arg(&pcap));
    assert_eq!(code, 0, "ferroce rejects scapy's ICRC: {out}\n{err}");
    let got: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        got.len(),
        want.len() + 1,
        "a line per packet and the summary:\n{out}"
    );
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g["icrc_ok"], true, "{g}");
        for (k, v) in w.as_object().unwrap() {
            let actual = match k.as_str() {
                "aeth" => g["aeth"]["syndrome"].clone(),
                "rkey" => g["reth"]["rkey"].clone(),
                "vlan" => g["vlan"]["vid"].clone(),
                "ipv6" => serde_json::json!(g["src"].as_str().unwrap().contains(':')),
                _ => g[k].clone(),
            };
            assert_eq!(&actual, v, "field {k} of {g}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ferroce_built_packets_pass_scapy_and_tshark() {
    let dir = tmp("ferroce");
    let pcap = dir.join("ferroce.pcap");
    let pkts = ferroce_packets();
    assert_eq!(pkts.len(), 38 * 3);
    write_pcap(&pcap, &pkts.iter().map(|p| p.2.clone()).collect::<Vec<_>>());

    // scapy recomputes every ICRC its own way.
    let script = root().join("tests/interop/scapy_crosscheck.py");
    let (code, stdout, stderr) = run(Command::new("python3").arg(&script).arg("check").arg(&pcap));
    assert_eq!(code, 0, "scapy disagrees:\n{stdout}\n{stderr}");
    let sum: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(sum["roce"], pkts.len(), "{sum}");
    assert_eq!(sum["icrc_mismatch"], 0);

    // tshark dissects each as InfiniBand with our opcode, QP and PSN, and nothing malformed.
    let (code, out, err) = run(Command::new("tshark").arg("-r").arg(&pcap).args([
        "-T",
        "fields",
        "-E",
        "separator=,",
        "-e",
        "infiniband.bth.opcode",
        "-e",
        "infiniband.bth.destqp",
        "-e",
        "infiniband.bth.psn",
        "-e",
        "_ws.malformed",
        "-e",
        "_ws.expert.severity",
    ]));
    assert_eq!(code, 0, "tshark: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), pkts.len(), "{out}");
    for (line, (opcode, encap, _)) in lines.iter().zip(&pkts) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(
            f[0],
            opcode.to_string(),
            "opcode {opcode:#x} {encap}: tshark says {line}"
        );
        assert_eq!(f[1], "0x000012", "dest QP of {opcode:#x} {encap}: {line}");
        assert_eq!(
            f[2],
            (0x00ab_cdef).to_string(),
            "PSN of {opcode:#x} {encap}: {line}"
        );
        assert!(
            f.get(3).is_none_or(|m| m.is_empty()),
            "tshark finds {opcode:#x} {encap} malformed: {line}"
        );
        // Expert severities: 4194304 note, 6291456 warning, 8388608 error.
        for s in f
            .get(4)
            .map(|s| s.split(';').collect::<Vec<_>>())
            .unwrap_or_default()
        {
            let sev: u64 = s.parse().unwrap_or(0);
            assert!(
                sev < 6_291_456,
                "tshark warns on {opcode:#x} {encap}: {line}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pcapng_reads_like_pcap() {
    // editcap (wireshark-common, which tshark brings) converts a golden capture to pcapng.
    let dir = tmp("pcapng");
    let src = root().join("tests/data/rxe/read_bw.pcap");
    let ng = dir.join("read_bw.pcapng");
    let (code, _, err) = run(Command::new("editcap")
        .args(["-F", "pcapng"])
        .arg(&src)
        .arg(&ng));
    assert_eq!(code, 0, "editcap: {err}");
    let decode = |p: &Path| {
        run(Command::new(env!("CARGO_BIN_EXE_rocectl"))
            .args(["decode", "--verify-icrc"])
            .arg(p))
    };
    let (c1, a, _) = decode(&src);
    let (c2, b, e) = decode(&ng);
    assert_eq!((c1, c2), (0, 0), "{e}");
    if let Some((x, y)) = a.lines().zip(b.lines()).find(|(x, y)| x != y) {
        panic!("pcap and pcapng decode differently:\n{x}\n{y}");
    }
    assert_eq!(a.lines().count(), b.lines().count());
    assert!(a.contains("RC RDMA READ Response First"));
    let _ = std::fs::remove_dir_all(&dir);
}
