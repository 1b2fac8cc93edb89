//! CRC-32 (Ethernet polynomial, reflected) over a buffer whose first 64 bytes are ORed with
//! masks on the way in: the kernel of the RoCEv2 ICRC ([`crate::icrc`]).
//!
//! The ICRC covers the headers with a few fields replaced by ones. Copying the headers to
//! apply the masks and hashing the copy and the payload separately costs two CRC reductions
//! (crc32fast: ~35 ns for a 64-byte payload here); so this folds the packet in place in one
//! pass with PCLMULQDQ (Intel's "Fast CRC Computation Using PCLMULQDQ"), ORing each mask into
//! its 16-byte block in a register as it is loaded. Without PCLMULQDQ a table-driven loop does
//! the same, byte by byte.

/// Masks ORed into bytes 0..64 of the input, as four little-endian 16-byte blocks.
pub type Masks = [u128; 4];

const fn table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

static TABLE: [u32; 256] = table();

fn mask_byte(masks: &Masks, i: usize) -> u8 {
    if i < 64 {
        (masks[i / 16] >> ((i % 16) * 8)) as u8
    } else {
        0
    }
}

/// The table-driven reference: CRC-32 of `data` (bytes below 64 ORed with `masks`), continuing
/// from `crc` (the CRC of whatever came before; 0 for nothing).
pub fn crc32_masked_scalar(crc: u32, data: &[u8], masks: &Masks) -> u32 {
    let mut c = !crc;
    for (i, b) in data.iter().enumerate() {
        let b = b | mask_byte(masks, i);
        c = TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// CRC-32 of `data` with its first 64 bytes ORed with `masks`, continuing from `crc`.
#[inline]
pub fn crc32_masked(crc: u32, data: &[u8], masks: &Masks) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= 16
        && std::is_x86_feature_detected!("pclmulqdq")
        && std::is_x86_feature_detected!("sse4.1")
        && std::is_x86_feature_detected!("ssse3")
    {
        // SAFETY: the CPU has every feature the kernel is compiled for (checked just above).
        return unsafe { x86::crc32_masked(crc, data, masks) };
    }
    crc32_masked_scalar(crc, data, masks)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Masks;
    use core::arch::x86_64 as a;

    // Folding constants for the reflected CRC-32 polynomial 0x04C11DB7: x^(4*128+32),
    // x^(4*128-32) mod P for folding 4 blocks; x^(128+32), x^(128-32) for one; x^64 for the
    // 64-bit step; P and mu for the Barrett reduction (all bit-reflected, shifted left by one).
    const K1: i64 = 0x1_5444_2bd4;
    const K2: i64 = 0x1_c6e4_1596;
    const K3: i64 = 0x1_7519_97d0;
    const K4: i64 = 0x0_ccaa_009e;
    const K5: i64 = 0x1_63cd_6124;
    const P_X: i64 = 0x1_DB71_0641;
    const U_PRIME: i64 = 0x1_F701_1641;

    #[inline(always)]
    unsafe fn fold(acc: a::__m128i, next: a::__m128i, k: a::__m128i) -> a::__m128i {
        // SAFETY: pure register arithmetic; the caller enabled pclmulqdq.
        unsafe {
            let lo = a::_mm_clmulepi64_si128(acc, k, 0x00);
            let hi = a::_mm_clmulepi64_si128(acc, k, 0x11);
            a::_mm_xor_si128(a::_mm_xor_si128(next, lo), hi)
        }
    }

    /// Block `i` of `d` (16 bytes from `16 * i`), ORed with its mask if it has one.
    #[inline(always)]
    unsafe fn block(d: &[u8], i: usize, masks: &Masks) -> a::__m128i {
        let bytes = &d[16 * i..16 * i + 16];
        // SAFETY: `bytes` is 16 readable bytes (the slice above checked it); unaligned load.
        let v = unsafe { a::_mm_loadu_si128(bytes.as_ptr() as *const a::__m128i) };
        if i < 4 {
            let m = masks[i];
            // SAFETY: register arithmetic (SSE2 is baseline on x86_64).
            unsafe { a::_mm_or_si128(v, a::_mm_set_epi64x((m >> 64) as i64, m as i64)) }
        } else {
            v
        }
    }

    /// Up to 15 bytes as a zero-padded little-endian 128-bit value, without a trip through
    /// memory (which would stall store forwarding).
    #[inline(always)]
    fn partial(d: &[u8]) -> (u64, u64) {
        fn upto8(r: &[u8]) -> u64 {
            let n = r.len();
            match n {
                0 => 0,
                1..=3 => r.iter().rev().fold(0u64, |v, b| v << 8 | *b as u64),
                _ => {
                    let lo = u32::from_le_bytes(r[..4].try_into().expect("4")) as u64;
                    let hi = u32::from_le_bytes(r[n - 4..n].try_into().expect("4")) as u64;
                    lo | hi << ((n - 4) * 8)
                }
            }
        }
        if d.len() > 8 {
            (upto8(&d[..8]), upto8(&d[8..]))
        } else {
            (upto8(d), 0)
        }
    }

    #[target_feature(
        enable = "pclmulqdq",
        enable = "sse2",
        enable = "sse4.1",
        enable = "ssse3"
    )]
    pub(super) unsafe fn crc32_masked(crc: u32, d: &[u8], masks: &Masks) -> u32 {
        // SAFETY: loads go through `block`, which bounds-checks its slice; the rest is
        // register arithmetic with the features this function is compiled for.
        unsafe {
            let n = d.len();
            let init = a::_mm_cvtsi32_si128(!crc as i32);
            let k3k4 = a::_mm_set_epi64x(K4, K3);
            let mut x;
            let mut i; // next block index
            if n >= 64 {
                let mut x3 = a::_mm_xor_si128(block(d, 0, masks), init);
                let mut x2 = block(d, 1, masks);
                let mut x1 = block(d, 2, masks);
                let mut x0 = block(d, 3, masks);
                let k1k2 = a::_mm_set_epi64x(K2, K1);
                i = 4;
                while n - 16 * i >= 64 {
                    x3 = fold(x3, block(d, i, masks), k1k2);
                    x2 = fold(x2, block(d, i + 1, masks), k1k2);
                    x1 = fold(x1, block(d, i + 2, masks), k1k2);
                    x0 = fold(x0, block(d, i + 3, masks), k1k2);
                    i += 4;
                }
                x = fold(x3, x2, k3k4);
                x = fold(x, x1, k3k4);
                x = fold(x, x0, k3k4);
            } else {
                x = a::_mm_xor_si128(block(d, 0, masks), init);
                i = 1;
            }
            while n - 16 * i >= 16 {
                x = fold(x, block(d, i, masks), k3k4);
                i += 1;
            }
            // A final partial block of r bytes: shift the accumulator down by r bytes, bring the
            // new bytes in at the top, and fold the r bytes shifted out back in.
            let r = n - 16 * i;
            if r > 0 {
                let tail = &d[16 * i..];
                let (mut lo, mut hi) = partial(tail);
                // Masks reach here only for inputs under 64 bytes.
                if i < 4 {
                    let m = masks[i];
                    let keep = if r >= 16 {
                        u128::MAX
                    } else {
                        (1u128 << (8 * r)) - 1
                    };
                    let m = m & keep;
                    lo |= m as u64;
                    hi |= (m >> 64) as u64;
                }
                let seq = a::_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                let shl = a::_mm_add_epi8(seq, a::_mm_set1_epi8(r as i8 - 16));
                let shr = a::_mm_xor_si128(shl, a::_mm_set1_epi8(-128));
                let overflow = a::_mm_shuffle_epi8(x, shl);
                x = a::_mm_shuffle_epi8(x, shr);
                let part = a::_mm_set_epi64x(hi as i64, lo as i64);
                x = a::_mm_xor_si128(x, a::_mm_shuffle_epi8(part, shl));
                x = fold(overflow, x, k3k4);
            }
            // 128 -> 64 bits, then Barrett reduction to 32.
            let x = a::_mm_xor_si128(
                a::_mm_clmulepi64_si128(x, k3k4, 0x10),
                a::_mm_srli_si128(x, 8),
            );
            let low32 = a::_mm_set_epi32(0, 0, 0, !0);
            let x = a::_mm_xor_si128(
                a::_mm_clmulepi64_si128(a::_mm_and_si128(x, low32), a::_mm_set_epi64x(0, K5), 0x00),
                a::_mm_srli_si128(x, 4),
            );
            let pu = a::_mm_set_epi64x(U_PRIME, P_X);
            let t1 = a::_mm_clmulepi64_si128(a::_mm_and_si128(x, low32), pu, 0x10);
            let t2 = a::_mm_clmulepi64_si128(a::_mm_and_si128(t1, low32), pu, 0x00);
            !(a::_mm_extract_epi32(a::_mm_xor_si128(x, t2), 1) as u32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unmasked_matches_crc32fast() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for n in 0..data.len() {
            assert_eq!(
                crc32_masked(0, &data[..n], &[0; 4]),
                crc32fast::hash(&data[..n]),
                "len {n}"
            );
        }
    }

    proptest! {
        #[test]
        fn simd_matches_scalar(
            data in proptest::collection::vec(any::<u8>(), 0..400),
            masks in any::<[u128; 4]>(),
            init in any::<u32>()
        ) {
            prop_assert_eq!(crc32_masked(init, &data, &masks), crc32_masked_scalar(init, &data, &masks));
        }
    }
}
