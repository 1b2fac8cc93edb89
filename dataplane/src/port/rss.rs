//! Receive-side scaling: which queue of a port a RoCEv2 flow lands on, and how a sender picks
//! the UDP source port that makes it land on the queue of the lcore owning the destination QP.
//!
//! A NIC with RSS hashes each received packet's addresses and ports with the Toeplitz function
//! under a secret-free 40-byte key, takes the hash's low bits as an index into its redirection
//! table (RETA) and delivers the packet to the queue that entry names. RoCEv2 frames of one QP
//! all carry the same addresses and destination port 4791, so the only field a sender can vary
//! is the UDP source port, which the specification leaves to it (fixed per QP, for ordering).
//!
//! ferroce's ports with RSS use [`KEY`] (the key of Microsoft's RSS verification suite, which
//! many NICs and DPDK's testpmd also default to) and a redirection table whose entry `j` names
//! queue `j % queues`. A ferroce QP numbers its owner lcore in the top bits of its QPN, so a
//! sender that knows the remote QPN knows the queue that should receive: [`steer_sport`] picks
//! a source port in Linux's range (0xC000-0xFFFF), starting from the one Linux would use, whose
//! hash has that queue in its low [`STEER_BITS`] bits. Then for any RETA of at most
//! 2^STEER_BITS entries filled that way (64 and 128 are usual), and any queue count that
//! divides 2^STEER_BITS for larger tables, the flow reaches the owner lcore with no handoff.
//! Toward peers that are not ferroce nothing is lost: the port is still in Linux's range, and
//! different QPs still get different ports.

use core::net::IpAddr;

/// The RSS key ferroce programs on ports that take a 40-byte key.
pub const KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// Low hash bits the steering fixes: the RETA index for tables of up to 128 entries.
pub const STEER_BITS: u32 = 7;

/// The Toeplitz hash of `input` under `key` (which must be at least 4 bytes longer than the
/// input, as 40 bytes are for the 36 bytes of an IPv6 4-tuple).
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    debug_assert!(key.len() >= input.len() + 4);
    let mut hash = 0u32;
    // The 32-bit window of the key that lines up with the current input bit.
    let mut window = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    for (i, &byte) in input.iter().enumerate() {
        let next = key.get(i + 4).copied().unwrap_or(0);
        for bit in (0..8).rev() {
            if byte >> bit & 1 == 1 {
                hash ^= window;
            }
            window = window << 1 | (next >> bit & 1) as u32;
        }
    }
    hash
}

/// The RSS hash of a UDP (or TCP) 4-tuple as NICs compute it: source address, destination
/// address, source port, destination port, in network order. `None` when the two addresses
/// are of different families.
pub fn hash_l4(key: &[u8], src: IpAddr, dst: IpAddr, sport: u16, dport: u16) -> Option<u32> {
    let mut buf = [0u8; 36];
    let n = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            buf[..4].copy_from_slice(&s.octets());
            buf[4..8].copy_from_slice(&d.octets());
            8
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            buf[..16].copy_from_slice(&s.octets());
            buf[16..32].copy_from_slice(&d.octets());
            32
        }
        _ => return None,
    };
    buf[n..n + 2].copy_from_slice(&sport.to_be_bytes());
    buf[n + 2..n + 4].copy_from_slice(&dport.to_be_bytes());
    Some(toeplitz(key, &buf[..n + 4]))
}

/// The source port for a QP's packets from `src` to `dst` that a receiver with ferroce's RSS
/// set-up delivers on queue `queue`: the first port from `base` upwards (wrapping within
/// 0xC000-0xFFFF) whose hash has `queue` in its low [`STEER_BITS`] bits. `base` itself when
/// `queue` is beyond what the bits can name or the addresses are of different families.
pub fn steer_sport(src: IpAddr, dst: IpAddr, base: u16, queue: u16) -> u16 {
    let mask = (1u32 << STEER_BITS) - 1;
    if queue as u32 > mask {
        return base;
    }
    let base = base | 0xC000;
    for i in 0..0x4000u16 {
        let p = 0xC000 | (base.wrapping_add(i) & 0x3fff);
        match hash_l4(&KEY, src, dst, p, crate::wire::udp::ROCEV2_PORT) {
            Some(h) if h & mask == queue as u32 => return p,
            Some(_) => {}
            None => return base,
        }
    }
    base
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::{Ipv4Addr, Ipv6Addr};

    fn v4(s: &str) -> IpAddr {
        IpAddr::V4(s.parse::<Ipv4Addr>().unwrap())
    }
    fn v6(s: &str) -> IpAddr {
        IpAddr::V6(s.parse::<Ipv6Addr>().unwrap())
    }

    /// Microsoft's RSS verification suite ("Verifying the RSS Hash Calculation"): destination,
    /// source, and the hashes of the addresses alone and of the 4-tuple.
    #[test]
    fn matches_the_published_verification_vectors() {
        let v4_cases = [
            (
                "161.142.100.80",
                1766,
                "66.9.149.187",
                2794,
                0x323e8fc2,
                0x51ccc178,
            ),
            (
                "65.69.140.83",
                4739,
                "199.92.111.2",
                14230,
                0xd718262a,
                0xc626b0ea,
            ),
            (
                "12.22.207.184",
                38024,
                "24.19.198.95",
                12898,
                0xd2d0a5de,
                0x5c2b394a,
            ),
            (
                "209.142.163.6",
                2217,
                "38.27.205.30",
                48228,
                0x82989176,
                0xafc7327f,
            ),
            (
                "202.188.127.2",
                1303,
                "153.39.163.191",
                44251,
                0x5d1809c5,
                0x10e828a2,
            ),
        ];
        for (dst, dport, src, sport, addr_only, four) in v4_cases {
            let (d, s) = (v4(dst), v4(src));
            let (IpAddr::V4(d4), IpAddr::V4(s4)) = (d, s) else {
                unreachable!()
            };
            let mut a = [0u8; 8];
            a[..4].copy_from_slice(&s4.octets());
            a[4..].copy_from_slice(&d4.octets());
            assert_eq!(toeplitz(&KEY, &a), addr_only, "{src} -> {dst}");
            assert_eq!(
                hash_l4(&KEY, s, d, sport, dport),
                Some(four),
                "{src} -> {dst}"
            );
        }
        let v6_cases = [
            (
                "3ffe:2501:200:3::1",
                1766,
                "3ffe:2501:200:1fff::7",
                2794,
                0x2cc18cd5,
                0x40207d3d,
            ),
            (
                "ff02::1",
                4739,
                "3ffe:501:8::260:97ff:fe40:efab",
                14230,
                0x0f0c461c,
                0xdde51bbf,
            ),
            (
                "fe80::200:f8ff:fe21:67cf",
                38024,
                "3ffe:1900:4545:3:200:f8ff:fe21:67cf",
                44251,
                0x4b61e985,
                0x02d1feef,
            ),
        ];
        for (dst, dport, src, sport, addr_only, four) in v6_cases {
            let (d, s) = (v6(dst), v6(src));
            let (IpAddr::V6(d6), IpAddr::V6(s6)) = (d, s) else {
                unreachable!()
            };
            let mut a = [0u8; 32];
            a[..16].copy_from_slice(&s6.octets());
            a[16..].copy_from_slice(&d6.octets());
            assert_eq!(toeplitz(&KEY, &a), addr_only, "{src} -> {dst}");
            assert_eq!(
                hash_l4(&KEY, s, d, sport, dport),
                Some(four),
                "{src} -> {dst}"
            );
        }
        assert_eq!(hash_l4(&KEY, v4("10.0.0.1"), v6("::1"), 1, 2), None);
    }

    #[test]
    fn steered_ports_land_on_the_owner_queue_for_usual_tables() {
        let pairs = [
            (v4("10.0.0.1"), v4("10.0.0.2")),
            (v6("fd00::1"), v6("fd00::2")),
        ];
        for (src, dst) in pairs {
            let mut seen = std::collections::HashMap::<u16, std::collections::HashSet<u16>>::new();
            for qpn in 1..200u32 {
                let base = crate::wire::udp::source_port_for_qp(qpn, qpn + 7);
                for queue in [0u16, 1, 3, 5, 127] {
                    let p = steer_sport(src, dst, base, queue);
                    assert!(p >= 0xC000, "port {p:#x} outside Linux's range");
                    let h = hash_l4(&KEY, src, dst, p, 4791).unwrap();
                    // RETA of 128 or 64 entries, entry j -> queue j % n: the owner receives.
                    for (reta, queues) in [(128u32, 8u32), (128, 6), (64, 6), (512, 8)] {
                        if (queue as u32) < queues {
                            assert_eq!((h % reta) % queues, queue as u32, "{src} {p}");
                        }
                    }
                    seen.entry(queue).or_default().insert(p);
                }
            }
            // Still spread: about one port in 128 steers to a given queue, so the QPs toward
            // one queue share ~128 ports; 199 QPs must use most of them.
            for (q, ports) in seen {
                assert!(
                    ports.len() > 70,
                    "queue {q}: only {} distinct ports",
                    ports.len()
                );
            }
        }
        // Queues the low bits cannot name keep the base port.
        assert_eq!(
            steer_sport(v4("1.1.1.1"), v4("2.2.2.2"), 0xC123, 128),
            0xC123
        );
        assert_eq!(steer_sport(v4("1.1.1.1"), v6("::2"), 0xC123, 1), 0xC123);
    }
}
