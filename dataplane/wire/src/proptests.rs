//! Property tests: for every header, parse(emit(r)) == r for random `Repr`s; and for whole
//! packets of every opcode, build then parse gives back every header.

use super::ipv4::Ecn;
use super::opcode::{OPCODES, mask};
use super::packet::{Checks, ExtRepr, IpRepr, RoceRepr, build, parse};
use super::*;
use crate::PacketBuf;
use crate::buf::HeapBuf;
use proptest::prelude::*;

fn arb_bth() -> impl Strategy<Value = bth::Repr> {
    (
        any::<u8>(),
        any::<bool>(),
        any::<bool>(),
        0u8..4,
        any::<u16>(),
        any::<bool>(),
        any::<bool>(),
        0u8..64,
    )
        .prop_flat_map(
            |(opcode, se, mig_req, pad_count, pkey, fecn, becn, resv6)| {
                (0u32..1 << 24, any::<bool>(), 0u8..128, 0u32..1 << 24).prop_map(
                    move |(qp, ack, resv7, psn)| bth::Repr {
                        opcode,
                        se,
                        mig_req,
                        pad_count,
                        tver: 0,
                        pkey,
                        fecn,
                        becn,
                        resv6,
                        dest_qp: qp,
                        ack_req: ack,
                        resv7,
                        psn: Psn::new(psn),
                    },
                )
            },
        )
}

fn arb_syndrome() -> impl Strategy<Value = aeth::Syndrome> {
    any::<u8>().prop_map(aeth::Syndrome::from_byte)
}

fn arb_ext() -> impl Strategy<Value = ExtRepr> {
    (
        (any::<u32>(), any::<u8>(), 0u32..1 << 24),
        (any::<u64>(), any::<u32>(), any::<u32>()),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
        (arb_syndrome(), 0u32..1 << 24),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(d, r, a, (syn, msn), orig, imm, inv)| ExtRepr {
            deth: Some(deth::Repr {
                qkey: d.0,
                resv8: d.1,
                src_qp: d.2,
            }),
            reth: Some(reth::Repr {
                va: r.0,
                rkey: r.1,
                dma_len: r.2,
            }),
            atomic_eth: Some(atomic_eth::Repr {
                va: a.0,
                rkey: a.1,
                swap_add: a.2,
                compare: a.3,
            }),
            aeth: Some(aeth::Repr { syndrome: syn, msn }),
            atomic_ack: Some(atomic_ack_eth::Repr { orig }),
            immdt: Some(imm),
            ieth: Some(inv),
        })
}

fn arb_ip() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        (
            0u8..64,
            0u8..4,
            any::<u16>(),
            any::<bool>(),
            1u8..,
            any::<[u8; 4]>(),
            any::<[u8; 4]>()
        )
            .prop_map(|(dscp, ecn, ident, df, ttl, s, d)| IpRepr::V4(ipv4::Repr {
                dscp,
                ecn: Ecn::from_bits(ecn),
                ident,
                flags_frag: if df { 0x4000 } else { 0 },
                ttl,
                protocol: ipv4::PROTO_UDP,
                src: s.into(),
                dst: d.into(),
            })),
        (
            any::<u8>(),
            0u32..1 << 20,
            1u8..,
            any::<[u8; 16]>(),
            any::<[u8; 16]>()
        )
            .prop_map(|(tc, fl, hl, s, d)| {
                IpRepr::V6(ipv6::Repr {
                    traffic_class: tc,
                    flow_label: fl,
                    next_header: ipv4::PROTO_UDP,
                    hop_limit: hl,
                    src: s.into(),
                    dst: d.into(),
                })
            }),
    ]
}

proptest! {
    #[test]
    fn bth_roundtrip(r in arb_bth()) {
        let mut b = [0u8; bth::HEADER_LEN];
        r.emit(&mut bth::Header::new_unchecked(&mut b[..]));
        prop_assert_eq!(bth::Repr::parse(&bth::Header::new_checked(&b[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn extension_headers_roundtrip(e in arb_ext()) {
        let mut b = [0u8; 32];
        let d = e.deth.unwrap();
        d.emit(&mut deth::Header::new_unchecked(&mut b[..]));
        prop_assert_eq!(deth::Repr::parse(&deth::Header::new_checked(&b[..]).unwrap()).unwrap(), d);
        let r = e.reth.unwrap();
        r.emit(&mut reth::Header::new_unchecked(&mut b[..]));
        prop_assert_eq!(reth::Repr::parse(&reth::Header::new_checked(&b[..]).unwrap()).unwrap(), r);
        let a = e.atomic_eth.unwrap();
        a.emit(&mut atomic_eth::Header::new_unchecked(&mut b[..]));
        prop_assert_eq!(atomic_eth::Repr::parse(&atomic_eth::Header::new_checked(&b[..]).unwrap()).unwrap(), a);
        let k = e.aeth.unwrap();
        k.emit(&mut aeth::Header::new_unchecked(&mut b[..]));
        prop_assert_eq!(aeth::Repr::parse(&aeth::Header::new_checked(&b[..]).unwrap()).unwrap(), k);
        let o = e.atomic_ack.unwrap();
        o.emit(&mut atomic_ack_eth::Header::new_unchecked(&mut b[..]));
        prop_assert_eq!(atomic_ack_eth::Repr::parse(&atomic_ack_eth::Header::new_checked(&b[..]).unwrap()).unwrap(), o);
        let i = immdt::Repr { imm: e.immdt.unwrap() };
        i.emit(&mut immdt::Header::new_unchecked(&mut b[..]));
        prop_assert_eq!(immdt::Repr::parse(&immdt::Header::new_checked(&b[..]).unwrap()).unwrap(), i);
        let v = ieth::Repr { rkey: e.ieth.unwrap() };
        v.emit(&mut ieth::Header::new_unchecked(&mut b[..]));
        prop_assert_eq!(ieth::Repr::parse(&ieth::Header::new_checked(&b[..]).unwrap()).unwrap(), v);
    }

    #[test]
    fn l2_l3_l4_roundtrip(ip in arb_ip(), vid in proptest::option::of(0u16..4096), pcp in 0u8..8, sport in any::<u16>()) {
        let e = eth::Repr { dst: [1; 6], src: [2; 6], vlan: vid.map(|vid| eth::VlanTag { pcp, dei: false, vid }), ethertype: 0x0800 };
        let mut b = [0u8; 64];
        e.emit(&mut b);
        prop_assert_eq!(eth::Repr::parse(&eth::Frame::new_checked(&b[..]).unwrap()).unwrap(), e);
        match ip {
            IpRepr::V4(r) => {
                r.emit(&mut b, 8, false);
                let h = ipv4::Header::new_checked(&b[..]).unwrap();
                prop_assert!(h.verify_checksum());
                prop_assert_eq!(ipv4::Repr::parse(&h).unwrap(), r);
            }
            IpRepr::V6(r) => {
                r.emit(&mut b, 8);
                prop_assert_eq!(ipv6::Repr::parse(&ipv6::Header::new_checked(&b[..]).unwrap()).unwrap(), r);
            }
        }
        let u = udp::Repr { src_port: sport, dst_port: udp::ROCEV2_PORT, checksum: 0 };
        u.emit(&mut b, 8);
        prop_assert_eq!(udp::Repr::parse(&udp::Header::new_checked(&b[..]).unwrap()).unwrap(), u);
    }

    #[test]
    fn whole_packets_of_every_opcode_roundtrip(
        which in 0usize..38, b in arb_bth(), all in arb_ext(), ip in arb_ip(),
        vid in proptest::option::of(1u16..4095), payload in proptest::collection::vec(any::<u8>(), 0..300)
    ) {
        let (buf, repr, payload) = whole_packet(which, b, all, ip, vid, payload);
        let p = parse(buf.data(), Checks::ALL).unwrap();
        prop_assert_eq!(p.payload(buf.data()), &payload[..]);
        let back = RoceRepr::parse(buf.data(), &p).unwrap();
        let mut want = repr;
        want.eth.ethertype = match ip { IpRepr::V4(_) => eth::ETHERTYPE_IPV4, IpRepr::V6(_) => eth::ETHERTYPE_IPV6 };
        want.bth.pad_count = ((4 - payload.len() % 4) % 4) as u8;
        want.udp.checksum = back.udp.checksum; // computed for IPv6
        prop_assert_eq!(back, want);
    }

    #[test]
    fn fast_v4_parse_answers_as_the_general_parse_on_valid_frames(
        which in 0usize..38, b in arb_bth(), all in arb_ext(), ip in arb_ip(),
        vid in proptest::option::of(1u16..4095), payload in proptest::collection::vec(any::<u8>(), 0..300)
    ) {
        let v4_untagged = matches!(ip, IpRepr::V4(_)) && vid.is_none();
        let (buf, _, _) = whole_packet(which, b, all, ip, vid, payload);
        for checks in [Checks::ALL, Checks::NONE] {
            let fast = packet::parse_v4(buf.data(), checks);
            // It takes every untagged IPv4 frame and nothing else.
            prop_assert_eq!(fast.is_some(), v4_untagged);
            if let Some(f) = fast {
                prop_assert_eq!(Ok(f), packet::parse_general(buf.data(), checks));
            }
        }
    }

    #[test]
    fn fast_v4_parse_answers_as_the_general_parse_on_damaged_frames(
        which in 0usize..38, b in arb_bth(), all in arb_ext(), ip in arb_ip(),
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        at in any::<prop::sample::Index>(), xor in 1u8.., cut in 0usize..8, which_checks in 0usize..3
    ) {
        let (buf, _, _) = whole_packet(which, b, all, ip, None, payload);
        let mut f = buf.data().to_vec();
        // One byte changed, anywhere (the headers most often: their checks are what differ),
        // and maybe the frame cut short.
        let i = if at.index(4) == 0 { at.index(f.len()) } else { at.index(58.min(f.len())) };
        f[i] ^= xor;
        f.truncate(f.len().saturating_sub(cut));
        // Without the checksums, the structural checks alone must catch what they catch.
        let checks = [Checks::ALL, Checks::NONE, Checks { icrc: false, ipv4_checksum: true }][which_checks];
        let general = packet::parse_general(&f, checks);
        if let Some(fast) = packet::parse_v4(&f, checks) {
            prop_assert_eq!(Ok(fast), general);
        }
        prop_assert_eq!(parse(&f, checks), general);
    }
}

/// A packet of the `which`th valid opcode with the headers that opcode has (from `all`), built
/// into a buffer: the buffer, the headers as built, and the payload it carries.
fn whole_packet(
    which: usize,
    mut b: bth::Repr,
    all: ExtRepr,
    ip: IpRepr,
    vid: Option<u16>,
    payload: Vec<u8>,
) -> (HeapBuf, RoceRepr, Vec<u8>) {
    let opcode = OPCODES
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_valid())
        .nth(which)
        .unwrap()
        .0 as u8;
    let info = opcode::lookup(opcode);
    b.opcode = opcode;
    let has = |m| info.has(m);
    let ext = ExtRepr {
        deth: all.deth.filter(|_| has(mask::DETH)),
        reth: all.reth.filter(|_| has(mask::RETH)),
        atomic_eth: all.atomic_eth.filter(|_| has(mask::ATMETH)),
        aeth: all.aeth.filter(|_| has(mask::AETH)),
        atomic_ack: all.atomic_ack.filter(|_| has(mask::ATMACK)),
        immdt: all.immdt.filter(|_| has(mask::IMMDT)),
        ieth: all.ieth.filter(|_| has(mask::IETH)),
    };
    let payload = if has(mask::PAYLOAD) { payload } else { vec![] };
    let repr = RoceRepr {
        eth: eth::Repr {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
            vlan: vid.map(|vid| eth::VlanTag {
                pcp: 3,
                dei: false,
                vid,
            }),
            ethertype: 0,
        },
        ip,
        udp: udp::Repr {
            src_port: 0xc000,
            dst_port: udp::ROCEV2_PORT,
            checksum: 0,
        },
        bth: b,
        ext,
    };
    let mut buf = HeapBuf::from_slice(&payload);
    build(&mut buf, &repr, false).unwrap();
    (buf, repr, payload)
}
