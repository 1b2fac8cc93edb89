//! Golden tests on every capture made with Linux Soft-RoCE (tests/data/rxe, copied from the
//! shared peer harness, and the connection manager's from tests/interop/record_cm.py): every
//! RoCEv2 packet parses, its ICRC verifies, and re-emitting its headers around its payload
//! reproduces the frame byte for byte; every MAD to QP1 parses as a CM message and re-emits
//! byte for byte. Each capture must also show what it was made to show (opcodes, syndromes,
//! ECN, VLAN, IPv6, 4 KiB MTU, the CM's exchanges).

use dataplane::wire::aeth::{NakCode, Syndrome};
use dataplane::wire::cm::{
    CmaHeader, Message, MsgKind, PortSpace, RejReason, SidrStatus, split_service_id,
};
use dataplane::wire::ipv4::Ecn;
use dataplane::wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
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
    /// The CM MADs to QP1, in order: transaction ID and message.
    mads: Vec<(u64, Message)>,
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
        if let Some(a) = info.ext.aeth() {
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
        if info.dest_qp == GSI_QPN && info.opcode == op::UD_SEND_ONLY {
            // A MAD: the DETH names QP1's Q_Key, the payload is exactly one MAD, it parses as CM
            // and re-emits byte for byte.
            let d = info.ext.deth().expect("a UD SEND has a DETH");
            assert_eq!((d.qkey, d.src_qp), (GSI_QKEY, GSI_QPN), "{name} packet {n}");
            let mad = info.payload(frame);
            assert_eq!(mad.len(), MAD_LEN, "{name} packet {n}");
            let (hdr, msg) =
                Message::parse(mad).unwrap_or_else(|e| panic!("{name} packet {n}: {e}"));
            let mut out = [0u8; MAD_LEN];
            msg.emit(hdr.tid, &mut out).unwrap();
            assert_eq!(
                out[..],
                mad[..],
                "{name} packet {n}: {} re-emits",
                msg.name()
            );
            seen.mads.push((hdr.tid, msg));
        }
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
    assert_eq!(files.len(), 24, "{files:?}");
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
    // perftest -R makes two connections (its exchange QP, then the test QP), each REQ -> REP ->
    // RTU with one TID, and tears both down, each side sending one DREQ.
    let names: Vec<&str> = s.mads.iter().map(|m| m.1.name()).collect();
    assert_eq!(
        names,
        [
            "REQ", "REP", "RTU", "REQ", "REP", "RTU", "DREQ", "DREP", "DREQ", "DREP"
        ]
    );
    // Each side's QPN by its communication ID, for the DREQs' remote QPNs.
    let mut qpns = BTreeMap::new();
    for hs in s.mads[..6].chunks(3) {
        let (Message::Req(req), Message::Rep(rep)) = (hs[0].1, hs[1].1) else {
            unreachable!()
        };
        assert!(hs.iter().all(|m| m.0 == hs[0].0), "one TID per handshake");
        assert_eq!(
            split_service_id(req.service_id),
            Some((PortSpace::Tcp, 18515))
        );
        assert_eq!(rep.remote_comm_id, req.local_comm_id);
        assert_eq!(hs[2].1.comm_ids(), (req.local_comm_id, rep.local_comm_id));
        qpns.insert(req.local_comm_id, req.local_qpn);
        qpns.insert(rep.local_comm_id, rep.local_qpn);
    }
    for (dreq, drep) in [(6, 7), (8, 9)] {
        let (a, b) = (s.mads[dreq].1.comm_ids(), s.mads[drep].1.comm_ids());
        assert_eq!((b.0, b.1), (a.1, a.0), "a DREP swaps its DREQ's IDs");
        assert_eq!(s.mads[dreq].0, s.mads[drep].0);
        let Message::Dreq(d) = s.mads[dreq].1 else {
            unreachable!()
        };
        assert_eq!(Some(&d.remote_qpn), qpns.get(&d.remote_comm_id));
    }
}

/// The CM messages of a capture, by name.
fn cm_names(s: &Seen) -> Vec<&'static str> {
    s.mads.iter().map(|m| m.1.name()).collect()
}

#[test]
fn rdmacm_utils_connections_rejects_mras_and_sidr() {
    // rping over IPv4 and IPv6: one connection, torn down by the client.
    for (cap, v6) in [("rping_cm.pcap", false), ("rping_cm_v6.pcap", true)] {
        let s = check_capture(cap);
        assert_eq!(cm_names(&s), ["REQ", "REP", "RTU", "DREQ", "DREP"], "{cap}");
        let Message::Req(req) = s.mads[0].1 else {
            unreachable!()
        };
        let h = CmaHeader::parse(&req.private_data).unwrap();
        assert_eq!((h.src.is_ipv6(), h.dst.is_ipv6()), (v6, v6), "{cap}");
        assert_eq!(s.ipv6 > 0, v6, "{cap}");
        // rping's data moves on the connection's RC QPs: SEND, READ and WRITE.
        has_all(
            &s,
            &[op::RC_SEND_ONLY, op::RC_READ_REQUEST, op::RC_WRITE_ONLY],
        );
    }
    // No listener: REJ "invalid service ID" of the REQ, with no communication ID of its own.
    let s = check_capture("cm_rej.pcap");
    assert_eq!(cm_names(&s), ["REQ", "REJ"]);
    let Message::Rej(rej) = s.mads[1].1 else {
        unreachable!()
    };
    assert_eq!(rej.reason, RejReason::InvalidServiceId);
    assert_eq!(rej.message_rejected, MsgKind::Req);
    assert_eq!(s.mads[1].1.comm_ids(), (0, s.mads[0].1.comm_ids().0));
    // A stopped listener: the REQ is sent again after its timeout (4.096 us * 2^20 plus the
    // packet life time) and the passive CM answers the duplicate with the MRA rdma_cm held
    // back; the connection completes once the listener runs again.
    let s = check_capture("cm_mra.pcap");
    assert_eq!(
        cm_names(&s),
        ["REQ", "REQ", "MRA", "REP", "RTU", "DREQ", "DREP"]
    );
    assert_eq!(
        s.mads[0], s.mads[1],
        "the retransmitted REQ is the same MAD"
    );
    let Message::Mra(mra) = s.mads[2].1 else {
        unreachable!()
    };
    assert_eq!((mra.message_mraed, mra.service_timeout), (MsgKind::Req, 24));
    // udaddy: SIDR for RDMA_PS_UDP, then UD SENDs to the QP the SIDR_REP named.
    let s = check_capture("udaddy.pcap");
    assert_eq!(cm_names(&s), ["SIDR_REQ", "SIDR_REP"]);
    let Message::SidrRep(rep) = s.mads[1].1 else {
        unreachable!()
    };
    assert_eq!((rep.status, rep.qkey), (SidrStatus::Ok, 0x0123_4567));
    assert!(s.dest_qps.contains(&rep.qpn), "{:?}", s.dest_qps);
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

/// ibv_ud_pingpong's datagrams (ud_pingpong.pcap) through a ferroce UD QP: each lands after
/// the 40-byte GRH area and completes with the sender's QPN; and a ferroce UD QP sending the
/// same message from the same QPN, PSN and UDP port puts the same UDP, BTH, DETH and payload
/// bytes on the wire as rxe did, under a valid ICRC.
#[test]
fn ud_pingpong_datagrams_through_a_ud_qp() {
    use dataplane::transport::cq::{CompletionQueue, WcOpcode, WcStatus};
    use dataplane::transport::mr::{Access, MrTable};
    use dataplane::transport::qp::{Mtu, Path, QpType};
    use dataplane::transport::rc::{QpCaps, RcQp};
    use dataplane::transport::wr::{SendOp, SendWr, Sge, UdDest};
    const QKEY: u32 = 0x1111_1111;
    const VA: u64 = 0x4000_0000;
    let ud_qp = |qpn: u32, psn: u32| {
        let mut mrs = MrTable::new();
        let pd = mrs.alloc_pd();
        let key = mrs
            .register(pd, VA, Box::new(vec![0u8; 8192]), Access::LOCAL_WRITE)
            .unwrap();
        let caps = QpCaps {
            qp_type: QpType::Ud,
            ..QpCaps::default()
        };
        let mut qp = RcQp::new(qpn, pd, caps).unwrap();
        qp.activate_ud(QKEY, Mtu::M1024, psn).unwrap();
        (qp, mrs, key)
    };
    let file = std::fs::File::open(data_dir().join("ud_pingpong.pcap")).unwrap();
    let mut reader = PcapReader::new(file).unwrap();
    let mut datagrams = 0;
    while let Some(pkt) = reader.next_packet() {
        let f = pkt.unwrap().data.into_owned();
        let Ok(info) = parse(&f, Checks::ALL) else {
            continue;
        };
        if info.opcode != op::UD_SEND_ONLY {
            continue;
        }
        datagrams += 1;
        let deth = info.ext.deth().unwrap();
        let payload = info.payload(&f).to_vec();
        // Receive it.
        let (mut qp, mut mrs, key) = ud_qp(info.dest_qp, 0);
        let (mut scq, mut rcq) = (CompletionQueue::new(8), CompletionQueue::new(8));
        let sge = Sge {
            addr: VA,
            length: 40 + payload.len() as u32,
            lkey: key,
        };
        qp.post_recv(dataplane::transport::wr::RecvWr {
            wr_id: 1,
            sg: [sge].into_iter().collect(),
        })
        .unwrap();
        qp.handle_frame(
            dataplane::time::Instant(0),
            &f,
            &mut mrs,
            &mut scq,
            &mut rcq,
        );
        let mut wcs = Vec::new();
        rcq.poll(8, &mut wcs);
        let c = wcs.first().expect("a receive completion");
        assert_eq!(
            (c.status, c.opcode, c.byte_len, c.src_qp),
            (
                WcStatus::Success,
                WcOpcode::Recv,
                40 + payload.len() as u32,
                Some(deth.src_qp)
            )
        );
        let mut got = vec![0u8; 40 + payload.len()];
        mrs.get(key).unwrap().read(VA, &mut got).unwrap();
        assert_eq!(&got[..20], &[0u8; 20][..]);
        assert_eq!(
            &got[20..40],
            &f[14..34],
            "the IPv4 header in the GRH's last 20 bytes"
        );
        assert_eq!(&got[40..], &payload[..]);
        // Send it again from a QP with the sender's numbers.
        let (mut tx, mut tmrs, tkey) = ud_qp(deth.src_qp, info.psn.value());
        tmrs.get_mut(tkey).unwrap().write(VA, &payload).unwrap();
        let path = Path {
            local_ip: info.src_ip,
            remote_ip: info.dst_ip,
            local_mac: f[6..12].try_into().unwrap(),
            remote_mac: f[0..6].try_into().unwrap(),
            udp_sport: info.udp_src,
            dscp: 0,
            ecn: 0,
            vlan: None,
        };
        let mut wr = SendWr::new(
            2,
            SendOp::Send,
            [Sge {
                addr: VA,
                length: payload.len() as u32,
                lkey: tkey,
            }]
            .into_iter()
            .collect(),
        );
        wr.ud = Some(UdDest {
            path,
            dest_qp: info.dest_qp,
            qkey: deth.qkey,
        });
        tx.post_send(&wr, wr.wr_id, None).unwrap();
        let mut out = Vec::new();
        assert!(tx.poll_transmit(
            dataplane::time::Instant(0),
            &tmrs,
            &mut scq,
            &mut rcq,
            &mut out
        ));
        parse(&out, Checks::ALL).expect("our datagram parses and its ICRC verifies");
        assert_eq!(out.len(), f.len());
        let (n, icrc) = (f.len(), 4);
        assert_eq!(
            &out[34..n - icrc],
            &f[34..n - icrc],
            "UDP, BTH, DETH, payload"
        );
        wcs.clear();
        scq.poll(8, &mut wcs);
        assert_eq!(
            wcs.iter().map(|c| c.status).collect::<Vec<_>>(),
            [WcStatus::Success]
        );
        assert!(!tx.poll_transmit(
            dataplane::time::Instant(0),
            &tmrs,
            &mut scq,
            &mut rcq,
            &mut out
        ));
    }
    assert_eq!(datagrams, 8, "4 iterations each way");
}
