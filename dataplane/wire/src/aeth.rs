//! ACK Extended Transport Header (4 bytes): syndrome and MSN.
//! Follows the BTH of ACKs, atomic ACKs and RDMA READ Response First/Last/Only.

use super::Result;
use core::time::Duration;

/// Header length.
pub const HEADER_LEN: usize = 4;

/// NAK codes (syndrome bits 7-5 = 011).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: acknowledges every PSN before it.
    PsnSequenceError,
    /// Invalid request.
    InvalidRequest,
    /// Remote access error.
    RemoteAccessError,
    /// Remote operational error.
    RemoteOperationalError,
    /// Invalid RD request.
    InvalidRdRequest,
    /// A reserved code.
    Reserved(u8),
}

impl NakCode {
    #[inline]
    fn from_bits(v: u8) -> NakCode {
        match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            x => NakCode::Reserved(x),
        }
    }
    #[inline]
    fn bits(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(x) => x & 0x1f,
        }
    }
}

/// The AETH syndrome as a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// ACK with a credit count (0x1f: no limit, "invalid credits").
    Ack {
        /// Credit code (5 bits).
        credits: u8,
    },
    /// Receiver not ready: retry after the timer's duration.
    RnrNak {
        /// Timer code (5 bits).
        timer: u8,
    },
    /// NAK.
    Nak(NakCode),
    /// Reserved syndrome (bits 7-5 = 010 or 1xx).
    Reserved(u8),
}

/// RNR NAK timer durations in microseconds, by timer code (IBTA table 45).
const RNR_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

#[inline]
/// How long an RNR NAK with this timer code asks the requester to wait.
pub fn rnr_duration(timer: u8) -> Duration {
    Duration::from_micros(RNR_US[(timer & 0x1f) as usize] as u64)
}

impl Syndrome {
    #[inline]
    /// From the syndrome byte.
    pub fn from_byte(b: u8) -> Syndrome {
        match b >> 5 {
            0b000 => Syndrome::Ack { credits: b & 0x1f },
            0b001 => Syndrome::RnrNak { timer: b & 0x1f },
            0b011 => Syndrome::Nak(NakCode::from_bits(b & 0x1f)),
            _ => Syndrome::Reserved(b),
        }
    }
    #[inline]
    /// To the syndrome byte.
    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => 0x60 | c.bits(),
            Syndrome::Reserved(b) => b,
        }
    }
    #[inline]
    /// True for an ACK.
    pub fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

super::header_view!(Header, HEADER_LEN, "A zero-copy view of an AETH.");

impl<T: AsRef<[u8]>> Header<T> {
    #[inline]
    /// Syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_byte(self.buffer.as_ref()[0])
    }
    #[inline]
    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        super::be_u32(self.buffer.as_ref(), 0) & 0x00ff_ffff
    }
}

/// A parsed AETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number.
    pub msn: u32,
}

impl Repr {
    #[inline]
    /// Parses an AETH.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Header<&T>) -> Result<Repr> {
        Ok(Repr {
            syndrome: h.syndrome(),
            msn: h.msn(),
        })
    }
    #[inline]
    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    #[inline]
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, h: &mut Header<&mut T>) {
        let v = (self.syndrome.to_byte() as u32) << 24 | (self.msn & 0x00ff_ffff);
        h.buffer.as_mut()[0..4].copy_from_slice(&v.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_from_the_captures() {
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::Ack { credits: 31 });
        assert_eq!(
            Syndrome::from_byte(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_byte(0x61),
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(Syndrome::from_byte(0x2c), Syndrome::RnrNak { timer: 12 });
        assert_eq!(rnr_duration(12), Duration::from_micros(640));
        assert_eq!(rnr_duration(0), Duration::from_micros(655_360));
        assert_eq!(rnr_duration(1), Duration::from_micros(10));
        assert_eq!(rnr_duration(31), Duration::from_micros(491_520));
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b, "{b:#x}");
        }
    }

    #[test]
    fn roundtrip() {
        let bytes = [0x60u8, 0x00, 0x01, 0x02];
        let h = Header::new_checked(&bytes[..]).unwrap();
        assert_eq!(h.msn(), 0x102);
        let r = Repr::parse(&h).unwrap();
        let mut out = [0u8; 4];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}
