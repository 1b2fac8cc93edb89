//! The invariant CRC of RoCEv2.
//!
//! CRC-32 (Ethernet polynomial, reflected, init all ones, final inversion) over 8 bytes of 0xFF
//! (standing for the InfiniBand LRH), the IP header, UDP header, BTH, extension headers, payload
//! and pad, with the fields a network may rewrite replaced by ones: IPv4 TOS, TTL and header
//! checksum; IPv6 traffic class, flow label and hop limit; the UDP checksum; and the BTH byte
//! holding FECN, BECN and resv6. It travels least-significant byte first.
//!
//! It runs on every packet. The 8-byte prefix is folded into a precomputed starting state, and
//! [`crate::crc::crc32_masked`] runs over the packet in place in one pass, ORing the masks into
//! the header blocks in registers: no copy, one reduction.

use super::{Error, Result};

/// Bytes of the ICRC.
pub const LEN: usize = 4;

const fn crc32_bitwise(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    let mut i = 0;
    while i < data.len() {
        crc ^= data[i] as u32;
        let mut k = 0;
        while k < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
            k += 1;
        }
        i += 1;
    }
    !crc
}

/// CRC-32 of the 8 bytes of 0xFF that stand for the LRH: the state the ICRC starts from.
const LRH_CRC: u32 = crc32_bitwise(&[0xff; 8]);

const fn masks(bytes: &[(usize, u8)]) -> crate::crc::Masks {
    let mut m = [0u128; 4];
    let mut i = 0;
    while i < bytes.len() {
        let (at, v) = bytes[i];
        m[at / 16] |= (v as u128) << ((at % 16) * 8);
        i += 1;
    }
    m
}

/// IPv4 without options: TOS (1), TTL (8), header checksum (10, 11); UDP checksum (26, 27);
/// the BTH byte with FECN, BECN and resv6 (32).
const V4_MASKS: crate::crc::Masks = masks(&[
    (1, 0xff),
    (8, 0xff),
    (10, 0xff),
    (11, 0xff),
    (26, 0xff),
    (27, 0xff),
    (32, 0xff),
]);
/// IPv6: traffic class and flow label (low nibble of 0; 1, 2, 3), hop limit (7); UDP checksum
/// (46, 47); the BTH byte with FECN, BECN and resv6 (52).
const V6_MASKS: crate::crc::Masks = masks(&[
    (0, 0x0f),
    (1, 0xff),
    (2, 0xff),
    (3, 0xff),
    (7, 0xff),
    (46, 0xff),
    (47, 0xff),
    (52, 0xff),
]);

/// The ICRC of a packet, given its bytes from the first byte of the IP header to the last byte
/// of the pad (the ICRC itself excluded). `ipv6` selects the masks.
#[inline]
pub fn compute(l3: &[u8], ipv6: bool) -> Result<u32> {
    let m = if ipv6 {
        if l3.len() < 40 + 8 + 12 {
            return Err(Error::Truncated);
        }
        &V6_MASKS
    } else {
        match l3.first() {
            // Version 4, no options: every RoCE packet.
            Some(0x45) if l3.len() >= 20 + 8 + 12 => &V4_MASKS,
            _ => return compute_v4_unusual(l3),
        }
    };
    Ok(masked(l3, m))
}

/// [`compute`] of an IPv4 packet whose header has no options (`l3[0]` is 0x45), at least 40
/// bytes long (IP, UDP and BTH headers): the caller has checked both.
#[inline]
pub fn compute_v4(l3: &[u8]) -> u32 {
    debug_assert!(l3.len() >= 20 + 8 + 12 && l3[0] == 0x45);
    masked(l3, &V4_MASKS)
}

/// The masked CRC from the LRH's state over `l3`, on the fastest kernel for its length.
#[inline(always)]
fn masked(l3: &[u8], m: &crate::crc::Masks) -> u32 {
    let k = crate::crc::kernel();
    if l3.len() <= LONG || k == crate::crc::Kernel::Vpclmul512 {
        return crate::crc::crc32_masked_on(k, LRH_CRC, l3, m);
    }
    // Long packets without VPCLMULQDQ: the masked kernel over the first 64 bytes (which hold
    // every masked field), then crc32fast, whose wider fold beats our 128-bit one on long runs,
    // over the rest.
    let head = crate::crc::crc32_masked_on(k, LRH_CRC, &l3[..64], m);
    let mut h = crc32fast::Hasher::new_with_initial(head);
    h.update(&l3[64..]);
    h.finalize()
}

/// [`compute`] over IPv4 with options (never seen in RoCE) or a header too short or malformed.
#[cold]
fn compute_v4_unusual(l3: &[u8]) -> Result<u32> {
    let ihl = (l3.first().ok_or(Error::Truncated)? & 0x0f) as usize * 4;
    if ihl < 20 {
        return Err(Error::BadLength);
    }
    if l3.len() < ihl + 8 + 12 {
        return Err(Error::Truncated);
    }
    if ihl == 20 {
        return Ok(masked(l3, &V4_MASKS));
    }
    // Options move the UDP and BTH masks.
    let o = ihl - 20;
    let m = masks(&[(1, 0xff), (8, 0xff), (10, 0xff), (11, 0xff)]);
    let mut extra = [0u128; 4];
    for at in [26 + o, 27 + o, 32 + o] {
        if at < 64 {
            extra[at / 16] |= 0xffu128 << ((at % 16) * 8);
        }
    }
    let all = [
        m[0] | extra[0],
        m[1] | extra[1],
        m[2] | extra[2],
        m[3] | extra[3],
    ];
    if 32 + o >= 64 {
        return compute_reference(l3, false);
    }
    Ok(crate::crc::crc32_masked(LRH_CRC, l3, &all))
}

/// Above this many bytes (IP header to pad) the tail goes to crc32fast's wide fold.
const LONG: usize = 256;

/// The ICRC in a frame's last 4 bytes, as a value.
#[inline]
pub fn carried(l3_with_icrc: &[u8]) -> Option<u32> {
    let n = l3_with_icrc.len();
    (n >= LEN).then(|| u32::from_le_bytes(l3_with_icrc[n - LEN..].try_into().expect("4 bytes")))
}

/// Checks the ICRC of a packet whose bytes from the IP header to the ICRC (inclusive) are
/// `l3_with_icrc`.
#[inline]
pub fn verify(l3_with_icrc: &[u8], ipv6: bool) -> Result<()> {
    let want = carried(l3_with_icrc).ok_or(Error::Truncated)?;
    let got = compute(&l3_with_icrc[..l3_with_icrc.len() - LEN], ipv6)?;
    if got == want {
        Ok(())
    } else {
        Err(Error::BadIcrc)
    }
}

#[inline]
/// The ICRC the slow, obvious way (a masked copy of everything), for tests and fuzzing.
pub fn compute_reference(l3: &[u8], ipv6: bool) -> Result<u32> {
    let mut v = vec![0xffu8; 8];
    v.extend_from_slice(l3);
    let p = 8;
    let udp = if ipv6 {
        for at in [p + 1, p + 2, p + 3, p + 7] {
            v[at] = 0xff;
        }
        v[p] |= 0x0f;
        p + 40
    } else {
        let ihl = (l3.first().ok_or(Error::Truncated)? & 0x0f) as usize * 4;
        for at in [p + 1, p + 8, p + 10, p + 11] {
            v[at] = 0xff;
        }
        p + ihl
    };
    if v.len() < udp + 8 + 12 {
        return Err(Error::Truncated);
    }
    v[udp + 6] = 0xff;
    v[udp + 7] = 0xff;
    v[udp + 8 + 4] = 0xff;
    Ok(crc32fast::hash(&v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lrh_state_is_the_crc_of_eight_ff() {
        assert_eq!(LRH_CRC, crc32fast::hash(&[0xff; 8]));
    }

    proptest! {
        #[test]
        fn fast_matches_reference_v4(mut pkt in proptest::collection::vec(any::<u8>(), 40..300)) {
            pkt[0] = 0x45;
            prop_assert_eq!(compute(&pkt, false).unwrap(), compute_reference(&pkt, false).unwrap());
        }

        #[test]
        fn fast_matches_reference_v6(pkt in proptest::collection::vec(any::<u8>(), 60..300)) {
            prop_assert_eq!(compute(&pkt, true).unwrap(), compute_reference(&pkt, true).unwrap());
        }

        #[test]
        fn masked_fields_do_not_change_it(
            pkt in proptest::collection::vec(any::<u8>(), 60..200),
            tos in any::<u8>(), ttl in any::<u8>(), bthb in any::<u8>()
        ) {
            let mut a = pkt.clone();
            a[0] = 0x45;
            let mut b = a.clone();
            b[1] = tos;
            b[8] = ttl;
            b[32] = bthb;
            prop_assert_eq!(compute(&a, false).unwrap(), compute(&b, false).unwrap());
            let mut c = a.clone();
            c[40] ^= 1; // a byte of payload does change it
            prop_assert_ne!(compute(&a, false).unwrap(), compute(&c, false).unwrap());
        }
    }

    #[test]
    fn options_take_the_general_path() {
        let mut pkt = vec![0u8; 100];
        pkt[0] = 0x46; // IHL 6: 4 bytes of options
        assert_eq!(
            compute(&pkt, false).unwrap(),
            compute_reference(&pkt, false).unwrap()
        );
        assert_eq!(compute(&pkt[..30], false), Err(Error::Truncated));
    }
}
