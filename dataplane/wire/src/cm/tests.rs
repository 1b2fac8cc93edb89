//! Each layout against the bytes Linux Soft-RoCE sent (tests/data/rxe: write_bw_cm.pcap,
//! `ib_write_bw -R`; cm_mra, cm_rej, udaddy and rping_cm_v6.pcap, recorded with
//! tests/interop/record_cm.py), the fields rxe leaves zero against hand-placed bytes, and a
//! property: whatever parses re-emits to bytes that parse to the same message.

use super::*;
use crate::mad::{MAD_LEN, class, method};
use proptest::prelude::*;

/// A MAD from the hex of its first bytes (the rest of the 256 are zero, as in the capture).
fn mad(hex: &str) -> [u8; MAD_LEN] {
    let hex: String = hex.split_whitespace().collect();
    let mut b = [0u8; MAD_LEN];
    for (i, out) in b.iter_mut().enumerate().take(hex.len() / 2) {
        *out = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    b
}

/// Parses, checks the header is a CM Send with `tid`, and re-emits byte for byte.
fn parse_exact(b: &[u8; MAD_LEN], tid: u64) -> Message {
    let (hdr, m) = Message::parse(b).unwrap();
    assert_eq!(
        (hdr.mgmt_class, hdr.class_version, hdr.method, hdr.tid),
        (class::CM, 2, method::SEND, tid)
    );
    assert_eq!(hdr.attr_id, m.attr_id());
    let mut out = [0xa5u8; MAD_LEN];
    m.emit(tid, &mut out).unwrap();
    assert_eq!(out[..], b[..], "{} re-emits exactly", m.name());
    m
}

// Frame 1: the REQ for perftest's first connection, vm0 (10.233.0.10) -> vm1 (10.233.0.11).
const REQ: &str = "010702030000000000000002bb602d4a0010000000000000
    4a2d60bb 00000000 0000000001064853 505400fffee90010 00000000 00000000 00001a00 00000000
    000000a0 1c9b73a7 ffff37f0 ffffffff 00000000000000000000ffff0ae9000a
    00000000000000000000ffff0ae9000b c24a0000 00400098
    0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000
    0040e613 000000000000000000000000 0ae9000a 000000000000000000000000 0ae9000b";
// Frames 2, 3, 171 and 172: its REP and RTU, and the second connection's DREQ and DREP.
const REP: &str = "010702030000000000000002bb602d4a0013000000000000
    95a48a9e 4a2d60bb 00000000 00001a00 00000000 fb57f700 000078e0 505400fffee90011";
const RTU: &str = "010702030000000000000002bb602d4a0014000000000000 4a2d60bb 95a48a9e";
const DREQ: &str = "010702030000000000000002bb602d4b0015000000000000 4b2d60bb 97a48a9e 00001b00";
const DREP: &str = "010702030000000000000002bb602d4b0016000000000000 97a48a9e 4b2d60bb";

#[test]
fn req_from_rxe() {
    let Message::Req(r) = parse_exact(&mad(REQ), 0x2_bb60_2d4a) else {
        panic!("not a REQ")
    };
    assert_eq!(r.local_comm_id, 0x4a2d_60bb);
    assert_eq!(
        split_service_id(r.service_id),
        Some((PortSpace::Tcp, 18515))
    );
    assert_eq!(r.local_ca_guid, 0x5054_00ff_fee9_0010);
    assert_eq!((r.local_qpn, r.starting_psn), (0x1a, 0x1c_9b73));
    assert_eq!((r.responder_resources, r.initiator_depth), (0, 0));
    assert_eq!((r.transport, r.extended_transport, r.srq), (0, 0, false));
    assert_eq!(
        (r.remote_cm_response_timeout, r.local_cm_response_timeout),
        (20, 20)
    );
    assert_eq!(
        (r.retry_count, r.rnr_retry_count, r.max_cm_retries),
        (7, 7, 15)
    );
    assert_eq!((r.pkey, path_mtu_bytes(r.path_mtu)), (0xffff, Some(1024)));
    let p = r.primary;
    assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xffff));
    assert_eq!(
        p.local_gid,
        "::ffff:10.233.0.10".parse::<Ipv6Addr>().unwrap()
    );
    assert_eq!(
        p.remote_gid,
        "::ffff:10.233.0.11".parse::<Ipv6Addr>().unwrap()
    );
    assert_eq!((p.flow_label, p.packet_rate), (0xc_24a0, 0));
    assert_eq!((p.traffic_class, p.hop_limit, p.sl), (0, 64, 0));
    assert_eq!((p.subnet_local, p.local_ack_timeout), (false, 19));
    assert_eq!(r.alternate, Path::default());
    let h = CmaHeader::parse(&r.private_data).unwrap();
    assert_eq!(h.src_port, 0xe613);
    assert_eq!(h.src, "10.233.0.10".parse::<IpAddr>().unwrap());
    assert_eq!(h.dst, "10.233.0.11".parse::<IpAddr>().unwrap());
    let mut pd = [0u8; private_len::REQ];
    h.emit(&mut pd).unwrap();
    assert_eq!(pd, r.private_data);
}

#[test]
fn rep_rtu_dreq_drep_from_rxe() {
    let Message::Rep(r) = parse_exact(&mad(REP), 0x2_bb60_2d4a) else {
        panic!("not a REP")
    };
    assert_eq!(
        (r.local_comm_id, r.remote_comm_id),
        (0x95a4_8a9e, 0x4a2d_60bb)
    );
    assert_eq!((r.local_qpn, r.starting_psn), (0x1a, 0xfb_57f7));
    assert_eq!((r.target_ack_delay, r.failover_accepted), (15, 0));
    assert_eq!((r.rnr_retry_count, r.srq, r.vendor_id), (7, false, 0));
    assert_eq!(r.local_ca_guid, 0x5054_00ff_fee9_0011);
    let m = parse_exact(&mad(RTU), 0x2_bb60_2d4a);
    assert!(matches!(m, Message::Rtu(_)));
    assert_eq!(m.comm_ids(), (0x4a2d_60bb, 0x95a4_8a9e));
    let Message::Dreq(d) = parse_exact(&mad(DREQ), 0x2_bb60_2d4b) else {
        panic!("not a DREQ")
    };
    assert_eq!(
        (d.local_comm_id, d.remote_comm_id, d.remote_qpn),
        (0x4b2d_60bb, 0x97a4_8a9e, 0x1b)
    );
    let m = parse_exact(&mad(DREP), 0x2_bb60_2d4b);
    assert_eq!(
        (m.name(), m.comm_ids()),
        ("DREP", (0x97a4_8a9e, 0x4b2d_60bb))
    );
}

// cm_mra.pcap frame 3: the passive side's rping stopped, the active side's REQ retransmitted,
// the passive CM answers with the MRA rdma_cm held back (service timeout 24).
const MRA: &str = "0107020300000000000000023782e50c0011000000000000 1810920a 0ce58237 00c0";
// cm_rej.pcap frame 2: a REQ to a port no one listens on; the REJ has no local ID of its own.
const REJ: &str = "0107020300000000000000023782e50d0012000000000000 00000000 0de58237 0000 0008";
// udaddy.pcap frames 1 and 2: SIDR for RDMA_PS_UDP port 7174 (rdma_cm's header with the
// client's 10.234.0.11 port 41693), answered with QPN 0x14 and rdma_cm's UDP Q_Key.
const SIDR_REQ: &str = "0107020300000000000000023782e50b0017000000000000
    0be58237 ffff0000 0000000001111c06 0040a2dd 000000000000000000000000 0aea000b
    000000000000000000000000 0aea000c";
const SIDR_REP: &str = "0107020300000000000000023782e50b0018000000000000
    0be58237 00000000 00001400 0000000001111c06 01234567";
// rping_cm_v6.pcap frame 1: a REQ over IPv6 (GIDs and rdma_cm addresses fd00:234::11 and ::12).
const REQ_V6: &str = "0107020300000000000000023782e50e0010000000000000
    0ee58237 00000000 0000000001061d30 505400fffee90111 00000000 00000000 00001201 00000001
    000000a0 2edad4a7 ffff37f0 ffffffff fd000234000000000000000000000011
    fd000234000000000000000000000012 8a652000 00400098
    0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000
    0060ca9e fd000234000000000000000000000011 fd000234000000000000000000000012";

#[test]
fn mra_rej_sidr_from_rxe() {
    let Message::Mra(m) = parse_exact(&mad(MRA), 0x2_3782_e50c) else {
        panic!("not an MRA")
    };
    assert_eq!(
        (m.local_comm_id, m.remote_comm_id),
        (0x1810_920a, 0x0ce5_8237)
    );
    assert_eq!((m.message_mraed, m.service_timeout), (MsgKind::Req, 24));
    let Message::Rej(r) = parse_exact(&mad(REJ), 0x2_3782_e50d) else {
        panic!("not a REJ")
    };
    assert_eq!((r.local_comm_id, r.remote_comm_id), (0, 0x0de5_8237));
    assert_eq!(
        (r.message_rejected, r.ari_len, r.reason),
        (MsgKind::Req, 0, RejReason::InvalidServiceId)
    );
    let Message::SidrReq(s) = parse_exact(&mad(SIDR_REQ), 0x2_3782_e50b) else {
        panic!("not a SIDR_REQ")
    };
    assert_eq!((s.request_id, s.pkey), (0x0be5_8237, 0xffff));
    assert_eq!(split_service_id(s.service_id), Some((PortSpace::Udp, 7174)));
    let h = CmaHeader::parse(&s.private_data).unwrap();
    assert_eq!(
        (h.src, h.src_port, h.dst),
        (
            "10.234.0.11".parse().unwrap(),
            41693,
            "10.234.0.12".parse().unwrap()
        )
    );
    let Message::SidrRep(s) = parse_exact(&mad(SIDR_REP), 0x2_3782_e50b) else {
        panic!("not a SIDR_REP")
    };
    assert_eq!(
        (s.request_id, s.status, s.qpn, s.qkey),
        (0x0be5_8237, SidrStatus::Ok, 0x14, 0x0123_4567)
    );
    assert_eq!(s.service_id, service_id(PortSpace::Udp, 7174));
}

#[test]
fn req_over_ipv6_from_rxe() {
    let Message::Req(r) = parse_exact(&mad(REQ_V6), 0x2_3782_e50e) else {
        panic!("not a REQ")
    };
    assert_eq!((r.responder_resources, r.initiator_depth), (1, 1));
    assert_eq!(
        r.primary.local_gid,
        "fd00:234::11".parse::<Ipv6Addr>().unwrap()
    );
    assert_eq!(
        r.primary.remote_gid,
        "fd00:234::12".parse::<Ipv6Addr>().unwrap()
    );
    assert_eq!((r.primary.flow_label, r.primary.hop_limit), (0x8_a652, 64));
    let h = CmaHeader::parse(&r.private_data).unwrap();
    assert_eq!(
        (h.src, h.src_port, h.dst),
        (
            "fd00:234::11".parse().unwrap(),
            0xca9e,
            "fd00:234::12".parse().unwrap()
        )
    );
}

#[test]
fn fields_rxe_leaves_zero_sit_where_the_tables_put_them() {
    // REJ of a REP (01 in byte 8's top bits), ARI length 3 (byte 9's top seven), reason 28.
    let b = mad("010702030000000000000000000000070012000000000000
        11111111 22222222 40 06 001c 0a0b0c");
    let Message::Rej(r) = parse_exact(&b, 7) else {
        panic!()
    };
    assert_eq!(
        (r.message_rejected, r.ari_len, r.reason),
        (MsgKind::Rep, 3, RejReason::ConsumerReject)
    );
    assert_eq!((r.reason.code(), r.reason.name()), (28, "consumer reject"));
    assert_eq!(r.ari[..3], [0x0a, 0x0b, 0x0c]);
    // A SIDR_REP's vendor ID: 16 bits at byte 6, 8 at byte 11, around the QPN.
    let b = mad("010702030000000000000000000000070018000000000000
        33333333 00 00 1234 00001256 0000000001111c06 01234567");
    let Message::SidrRep(s) = parse_exact(&b, 7) else {
        panic!()
    };
    assert_eq!((s.qpn, s.vendor_id), (0x12, 0x12_3456));
    // A REP's vendor ID: one byte after each of the QPN, the EECN and the PSN; SRQ and
    // failover bits.
    let b = mad("010702030000000000000000000000070013000000000000
        11111111 22222222 00000000 00001aab 000000cd fb57f7ef 0102 7c f0");
    let Message::Rep(r) = parse_exact(&b, 7) else {
        panic!()
    };
    assert_eq!(
        (r.local_qpn, r.starting_psn, r.vendor_id),
        (0x1a, 0xfb_57f7, 0xab_cdef)
    );
    assert_eq!(
        (
            r.target_ack_delay,
            r.failover_accepted,
            r.end_to_end_flow_control
        ),
        (15, 2, false)
    );
    assert_eq!((r.rnr_retry_count, r.srq), (7, true));
}

#[test]
fn not_cm_messages() {
    let mut b = mad(RTU);
    assert_eq!(Message::parse(&b[..255]).unwrap_err(), MadError::Truncated);
    b[1] = class::PERF_MGMT;
    assert_eq!(Message::parse(&b).unwrap_err(), MadError::WrongClass(4));
    let mut b = mad(RTU);
    b[2] = 1;
    assert_eq!(
        Message::parse(&b).unwrap_err(),
        MadError::BadClassVersion(1)
    );
    let mut b = mad(RTU);
    b[3] = method::GET_RESP;
    assert_eq!(Message::parse(&b).unwrap_err(), MadError::BadMethod(0x81));
    let mut b = mad(RTU);
    b[17] = 0x19;
    assert_eq!(
        Message::parse(&b).unwrap_err(),
        MadError::UnknownAttribute(attr::LAP)
    );
    let mut short = [0u8; 64];
    assert!(
        Message::Rtu(Ids {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: [0; 224]
        })
        .emit(1, &mut short)
        .is_err()
    );
}

#[test]
fn cma_header_v6_and_bad_ones() {
    let h = CmaHeader {
        src_port: 40000,
        src: "fd00:233::10".parse().unwrap(),
        dst: "fd00:233::11".parse().unwrap(),
    };
    let mut pd = [0u8; 56];
    h.emit(&mut pd).unwrap();
    assert_eq!(pd[1], 0x60);
    assert_eq!(CmaHeader::parse(&pd), Ok(h));
    assert_eq!(CmaHeader::parse(&pd[..35]), Err(MadError::Truncated));
    pd[1] = 0x50;
    assert!(matches!(CmaHeader::parse(&pd), Err(MadError::BadField(_))));
    pd[1] = 0x60;
    pd[0] = 1;
    assert!(matches!(CmaHeader::parse(&pd), Err(MadError::BadField(_))));
    let mixed = CmaHeader {
        dst: "10.0.0.1".parse().unwrap(),
        ..h
    };
    assert!(mixed.emit(&mut pd).is_err());
    assert_eq!(service_id(PortSpace::Tcp, 18515), 0x0106_4853);
    assert_eq!(split_service_id(0x1000_0106_4853), None);
    assert_eq!((path_mtu_code(4096), path_mtu_code(1000)), (Some(5), None));
    assert_eq!(
        (path_mtu_bytes(1), path_mtu_bytes(0), path_mtu_bytes(6)),
        (Some(256), None, None)
    );
    assert_eq!(RejReason::from_code(99), RejReason::Other(99));
    assert_eq!(RejReason::Other(99).code(), 99);
    for c in 0..64 {
        assert_eq!(RejReason::from_code(c).code(), c);
    }
}

proptest! {
    #[test]
    fn whatever_parses_reemits_to_itself(
        attr in 0x0010u16..0x0019,
        tid: u64,
        data in proptest::collection::vec(any::<u8>(), 232),
    ) {
        let mut b = [0u8; MAD_LEN];
        mad::Repr { mgmt_class: class::CM, class_version: 2, method: method::SEND, tid,
            attr_id: attr, ..mad::Repr::default() }.emit(&mut Mad::new_unchecked(&mut b[..]));
        b[24..].copy_from_slice(&data);
        let (_, m) = Message::parse(&b).unwrap();
        let mut out = [0u8; MAD_LEN];
        m.emit(tid, &mut out).unwrap();
        let (h2, m2) = Message::parse(&out).unwrap();
        prop_assert_eq!(m2, m);
        prop_assert_eq!(h2.tid, tid);
        // Emitting only clears bits (the reserved ones): it never sets one the input lacked.
        for (o, i) in out[24..].iter().zip(&data) {
            prop_assert_eq!(o & !i, 0);
        }
    }
}
