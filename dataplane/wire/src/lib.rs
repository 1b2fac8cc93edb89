//! RoCEv2 wire formats.
//!
//! One file per header, in smoltcp's style: a zero-copy view `Header<T: AsRef<[u8]>>` with
//! typed accessors (and setters when `T: AsMut<[u8]>`), and a `Repr`, the parsed owned form,
//! with `parse`, `buffer_len` and `emit`. The contract: after `new_checked` (which checks the
//! length) no accessor can panic, so received bytes always go through `new_checked`.
//!
//! Above the headers: [`opcode`], rxe's opcode table; [`psn`], 24-bit wrapping sequence numbers;
//! [`icrc`], the invariant CRC; and [`packet`], the one-pass receive parse into a
//! [`packet::PacketInfo`] and the transmit build that writes every header in place in front of a
//! payload. Nothing here allocates, and errors are values.
//!
//! ARP, ICMP and ICMPv6 with neighbour discovery are not here: the appliance's IP stack
//! (dataplane's `net`) takes them from smoltcp's `wire` directly. The L2-L4 headers here
//! ([`eth`], [`ipv4`], [`ipv6`], [`udp`]) are our own because they carry what RoCE needs and
//! smoltcp's Reprs do not (DSCP and ECN, IPv4 identification and
//! flags, the flow label), so that a parsed RoCE packet re-emits byte for byte.
//!
//! This crate is the bottom floor of ferroce (ARCHITECTURE.md): it names no other part of it and
//! no DPDK, so `rocectl` builds on it alone. With the headers it holds [`buf`], what a frame
//! buffer is ([`PacketBuf`], [`HeapBuf`](buf::HeapBuf), and [`PayloadMem`](buf::PayloadMem) for
//! payloads carried without a copy), and [`crc`], the masked CRC-32 kernel of the ICRC: the only
//! `unsafe` here, the PCLMULQDQ intrinsics, each call behind a CPU feature check.
#![deny(unsafe_code)]

pub mod buf;
#[allow(unsafe_code)]
pub mod crc;
// A prefetch hint for the packet path (an intrinsic, hence `unsafe`).
#[allow(unsafe_code)]
pub mod hint;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
pub mod eth;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ipv4;
pub mod ipv6;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod psn;
pub mod reth;
pub mod time;
pub mod udp;

pub use buf::PacketBuf;
pub use psn::Psn;

#[cfg(test)]
mod proptests;

/// Why bytes are not a valid header or packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Error {
    /// Shorter than the header or than a length field says.
    #[error("truncated")]
    Truncated,
    /// A version field (IP version, BTH TVer) is not one we speak.
    #[error("bad version")]
    BadVersion,
    /// A length field disagrees with the bytes.
    #[error("bad length")]
    BadLength,
    /// Not IPv4/IPv6 carrying UDP to port 4791.
    #[error("not RoCEv2")]
    NotRoce,
    /// The IPv4 header checksum is wrong.
    #[error("bad IPv4 header checksum")]
    BadChecksum,
    /// An IP fragment (RoCEv2 is never fragmented).
    #[error("IP fragment")]
    Fragment,
    /// An opcode the table does not know.
    #[error("unknown opcode")]
    UnknownOpcode,
    /// The pad count does not fit the payload (payload plus pad must be a multiple of 4).
    #[error("pad count mismatch")]
    PadMismatch,
    /// The ICRC does not match.
    #[error("bad ICRC")]
    BadIcrc,
}

/// Result of parsing.
pub type Result<T> = core::result::Result<T, Error>;

#[inline(always)]
pub(crate) fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
pub(crate) fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(w)
}

/// Defines a fixed-length header view: the struct, `new_unchecked`, `new_checked`, `check_len`,
/// `into_inner`.
macro_rules! header_view {
    ($name:ident, $len:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking its length.
            #[inline]
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }
            /// Wraps a buffer, checking that the header fits.
            #[inline]
            pub fn new_checked(buffer: T) -> $crate::Result<Self> {
                let h = Self::new_unchecked(buffer);
                h.check_len()?;
                Ok(h)
            }
            /// Checks that the header fits.
            #[inline]
            pub fn check_len(&self) -> $crate::Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err($crate::Error::Truncated)
                } else {
                    Ok(())
                }
            }
            /// The buffer.
            #[inline]
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}
pub(crate) use header_view;
