//! Golden tests on every capture made with Linux Soft-RoCE (tests/data/rxe, copied from the
//! shared peer harness): every RoCEv2 packet parses, its ICRC verifies, and re-emitting its
//! headers around its payload reproduces the frame byte for byte. Each capture must also show
//! what it was made to show (opcodes, syndromes, ECN, VLAN, IPv6, 4 KiB MTU).

use dataplane::wire::aeth::{NakCode, Syndrome};
use dataplane::wire::ipv4::Ecn;
use dataplane::wire::packet::{Checks, PacketInfo, RoceRepr, parse};
use dataplane::wire::{Error, opcode::op};
use pcap_file::pcap::PcapReader;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/rxe")
}

#[derive(Default, Debug)]
struct Seen {
    roce: usize,
    other: usize,
    opcodes: BTreeSet<u8>,
    syndromes: BTreeSet<u8>,
    ce: usize,
    ect: usize,
    vlans: BTreeSet<u16>,
    ipv6: usize,
    max_payload: usize,
    dest_qps: BTreeSet<u32>,
}

fn check_capture(name: &str) -> Seen {
    let path = data_dir().join(name);
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = PcapReader::new(file).expect("pcap header");
    let mut seen = Seen::default();
    let mut n = 0;
    while let Some(pkt) = reader.next_packet() {
        let pkt = pkt.expect("pcap record");
        n += 1;
        let frame = &pkt.data[..];
        let info: PacketInfo = match parse(frame, Checks::ALL) {
            Ok(i) => i,
            Err(Error::NotRoce) => {
                seen.other += 1;
                continue;
            }
            Err(e) => panic!("{name} packet {n}: {e:?}"),
        };
        seen.roce += 1;
        seen.opcodes.insert(info.opcode);
        seen.dest_qps.insert(info.dest_qp);
        if let Some(a) = info.aeth(frame) {
            seen.syndromes.insert(a.syndrome.to_byte());
        }
        match info.ecn {
            Ecn::Ce => seen.ce += 1,
            Ecn::Ect0 | Ecn::Ect1 => seen.ect += 1,
            Ecn::NotEct => {}
        }
        if let Some(v) = info.vlan {
            seen.vlans.insert(v.vid);
        }
        if info.src_ip.is_ipv6() {
            seen.ipv6 += 1;
        }
        seen.max_payload = seen.max_payload.max(info.payload_len as usize);
        // Re-emit: headers from the Repr, payload copied, pad and ICRC recomputed.
        let repr =
            RoceRepr::parse(frame, &info).unwrap_or_else(|e| panic!("{name} packet {n}: {e:?}"));
        let plen = info.payload_len as usize;
        let mut out = vec![0u8; repr.frame_len(plen)];
        let h = repr.header_len();
        out[h..h + plen].copy_from_slice(info.payload(frame));
        repr.emit(&mut out, plen, false).unwrap();
        assert_eq!(out.len(), frame.len(), "{name} packet {n}: length");
        if out != frame {
            let first = out.iter().zip(frame).position(|(a, b)| a != b).unwrap();
            panic!(
                "{name} packet {n} ({}): re-emitted frame differs at byte {first}",
                info.op.name
            );
        }
    }
    assert!(seen.roce > 0, "{name}: no RoCEv2 packets");
    seen
}

fn has_all(seen: &Seen, ops: &[u8]) {
    for o in ops {
        assert!(
            seen.opcodes.contains(o),
            "opcode {o:#04x} missing; saw {:x?}",
            seen.opcodes
        );
    }
}

const ACK_FULL_CREDIT: u8 = 0x1f;

#[test]
fn every_capture_parses_verifies_and_reemits_byte_for_byte() {
    let mut total = 0;
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(data_dir()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".pcap") {
            let s = check_capture(&name);
            total += s.roce;
            files.insert(name, s.roce);
        }
    }
    assert_eq!(files.len(), 19, "{files:?}");
    assert!(total > 5000, "{total} RoCEv2 packets in {files:?}");
}

#[test]
fn send_and_write_segments() {
    let s = check_capture("rc_pingpong.pcap");
    has_all(
        &s,
        &[
            op::RC_SEND_FIRST,
            op::RC_SEND_MIDDLE,
            op::RC_SEND_LAST,
            op::RC_ACK,
        ],
    );
    let s = check_capture("rc_pingpong_small.pcap");
    has_all(&s, &[op::RC_SEND_ONLY, op::RC_ACK]);
    let s = check_capture("write_bw.pcap");
    has_all(
        &s,
        &[
            op::RC_WRITE_FIRST,
            op::RC_WRITE_MIDDLE,
            op::RC_WRITE_LAST,
            op::RC_ACK,
        ],
    );
    assert_eq!(s.max_payload, 1024, "path MTU 1024");
    let s = check_capture("write_bw_small.pcap");
    has_all(&s, &[op::RC_WRITE_ONLY]);
    let s = check_capture("send_bw.pcap");
    has_all(
        &s,
        &[
            op::RC_SEND_FIRST,
            op::RC_SEND_MIDDLE,
            op::RC_SEND_LAST,
            op::RC_ACK,
        ],
    );
}

#[test]
fn reads_and_atomics() {
    let s = check_capture("read_bw.pcap");
    has_all(
        &s,
        &[
            op::RC_READ_REQUEST,
            op::RC_READ_RESPONSE_FIRST,
            op::RC_READ_RESPONSE_MIDDLE,
            op::RC_READ_RESPONSE_LAST,
        ],
    );
    let s = check_capture("atomic_cs.pcap");
    has_all(&s, &[op::RC_CMP_SWAP, op::RC_ATOMIC_ACK]);
    let s = check_capture("atomic_fa.pcap");
    has_all(&s, &[op::RC_FETCH_ADD, op::RC_ATOMIC_ACK]);
}

#[test]
fn naks_and_rnr() {
    let s = check_capture("write_bw_loss.pcap");
    assert!(
        s.syndromes
            .contains(&Syndrome::Nak(NakCode::PsnSequenceError).to_byte()),
        "{:x?}",
        s.syndromes
    );
    let s = check_capture("hostpeer_probe_badpsn.pcap");
    assert!(s.syndromes.contains(&0x60), "{:x?}", s.syndromes);
    let s = check_capture("hostpeer_probe_badrkey.pcap");
    assert!(
        s.syndromes
            .contains(&Syndrome::Nak(NakCode::InvalidRequest).to_byte()),
        "{:x?}",
        s.syndromes
    );
    let s = check_capture("hostpeer_probe_rnr.pcap");
    assert!(
        s.syndromes
            .contains(&Syndrome::RnrNak { timer: 12 }.to_byte()),
        "{:x?}",
        s.syndromes
    );
    assert!(s.syndromes.contains(&ACK_FULL_CREDIT));
}

#[test]
fn ud_and_connection_manager_mads() {
    let s = check_capture("ud_pingpong.pcap");
    has_all(&s, &[op::UD_SEND_ONLY]);
    let s = check_capture("write_bw_cm.pcap");
    has_all(&s, &[op::UD_SEND_ONLY]);
    assert!(
        s.dest_qps.contains(&1),
        "CM MADs go to QP1: {:?}",
        s.dest_qps
    );
}

#[test]
fn ecn_vlan_ipv6_and_4k_mtu() {
    let s = check_capture("write_bw_ecn.pcap");
    assert!(s.ce > 0 && s.ect > 0, "CE {} ECT {}", s.ce, s.ect);
    assert!(!s.opcodes.contains(&op::CNP), "rxe sends no CNP");
    let s = check_capture("vlan_write_bw.pcap");
    assert_eq!(s.vlans.iter().copied().collect::<Vec<_>>(), vec![100]);
    let s = check_capture("v6g_write_bw.pcap");
    assert!(s.ipv6 > 0);
    let s = check_capture("mtu4k_write_bw.pcap");
    assert_eq!(s.max_payload, 4096);
}

/// Inputs the fuzzer found crashing (now fixed) stay rejected cleanly.
#[test]
fn fuzz_regressions_are_rejected_without_panic() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/fuzz-regressions");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        assert!(parse(&bytes, Checks::ALL).is_err());
        assert!(parse(&bytes, Checks::NONE).is_err());
        n += 1;
    }
    assert!(n >= 2);
}
