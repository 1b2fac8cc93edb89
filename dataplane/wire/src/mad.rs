//! Management datagrams (MADs), IBTA Vol. 1 chapter 13.4: the 256-byte messages of the general
//! services QP, QP1. On RoCEv2 a MAD is the whole payload of a UD SEND Only to QP 1 whose DETH
//! carries the well-known Q_Key 0x80010000 (and P_Key 0xFFFF in the BTH); there is no subnet
//! manager, so the only class that crosses a RoCE network is the connection manager's ([`cm`]).
//!
//! Every MAD starts with the 24-byte common header: base version (1), management class, class
//! version, method (with the response bit 0x80), status, a class-specific word, the transaction ID
//! (chosen by the requester, echoed by the responder: how a reply or a retransmission is matched
//! to its request), the attribute ID (which message of the class this is) and the attribute
//! modifier. The other 232 bytes are the class's data. Short MADs are not a thing: anything under
//! 256 bytes is [`MadError::Truncated`], and bytes past 256 (a padded UD payload) are ignored.
//!
//! [`cm`]: crate::cm

use core::fmt;

/// A MAD's length: header and data.
pub const MAD_LEN: usize = 256;
/// The common header's length.
pub const HEADER_LEN: usize = 24;
/// The class data after the header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// The base version every MAD carries.
pub const BASE_VERSION: u8 = 1;
/// The general services QP.
pub const GSI_QPN: u32 = 1;
/// The Q_Key of QP1 (IBTA 13.5.2: "well-known Q_Key").
pub const GSI_QKEY: u32 = 0x8001_0000;

/// Management classes (IBTA 13.4.4).
pub mod class {
    /// Subnet administration.
    pub const SUBN_ADM: u8 = 0x03;
    /// Performance management.
    pub const PERF_MGMT: u8 = 0x04;
    /// Communication management.
    pub const CM: u8 = 0x07;
}

/// Methods (IBTA 13.4.5). A response is the request's method with [`RESPONSE`] set.
pub mod method {
    /// Get.
    pub const GET: u8 = 0x01;
    /// Set.
    pub const SET: u8 = 0x02;
    /// Send: a datagram that is not a request for an answer. Every CM message is a Send.
    pub const SEND: u8 = 0x03;
    /// Trap.
    pub const TRAP: u8 = 0x05;
    /// The response bit.
    pub const RESPONSE: u8 = 0x80;
    /// GetResp.
    pub const GET_RESP: u8 = GET | RESPONSE;
}

/// Why bytes are not a MAD (or not a CM message).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum MadError {
    /// Fewer than 256 bytes.
    #[error("truncated MAD")]
    Truncated,
    /// A base version other than 1.
    #[error("MAD base version {0}")]
    BadBaseVersion(u8),
    /// A management class the parser was not asked for.
    #[error("management class {0:#04x}")]
    WrongClass(u8),
    /// A class version the class does not speak (CM speaks 2).
    #[error("class version {0}")]
    BadClassVersion(u8),
    /// A method the attribute is never sent with.
    #[error("method {0:#04x}")]
    BadMethod(u8),
    /// An attribute ID the class does not define (or that we do not take).
    #[error("attribute {0:#06x}")]
    UnknownAttribute(u16),
    /// A field that must hold one of a few values holds another (the rdma_cm header's version or
    /// IP version).
    #[error("bad {0}")]
    BadField(&'static str),
}

/// Result of parsing a MAD.
pub type Result<T> = core::result::Result<T, MadError>;

mod field {
    use core::ops::Range;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Range<usize> = 4..6;
    pub const CLASS_SPECIFIC: Range<usize> = 6..8;
    pub const TID: Range<usize> = 8..16;
    pub const ATTR_ID: Range<usize> = 16..18;
    pub const RESV: Range<usize> = 18..20;
    pub const ATTR_MOD: Range<usize> = 20..24;
}

/// A zero-copy view of a MAD: the common header and the class data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mad<T: AsRef<[u8]>> {
    buffer: T,
}

fn be16(b: &[u8], r: core::ops::Range<usize>) -> u16 {
    u16::from_be_bytes([b[r.start], b[r.start + 1]])
}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Wraps a buffer without checking its length.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Mad { buffer }
    }
    /// Wraps a buffer, checking that a whole MAD fits.
    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < MAD_LEN {
            return Err(MadError::Truncated);
        }
        Ok(Mad { buffer })
    }
    /// The buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Base version (1).
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }
    /// Management class.
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }
    /// Class version.
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }
    /// Method, with the response bit.
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[field::METHOD]
    }
    /// Status.
    pub fn status(&self) -> u16 {
        be16(self.buffer.as_ref(), field::STATUS)
    }
    /// The class-specific word.
    pub fn class_specific(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CLASS_SPECIFIC)
    }
    /// Transaction ID.
    pub fn tid(&self) -> u64 {
        super::be_u64(self.buffer.as_ref(), field::TID.start)
    }
    /// Attribute ID.
    pub fn attr_id(&self) -> u16 {
        be16(self.buffer.as_ref(), field::ATTR_ID)
    }
    /// The reserved word after the attribute ID.
    pub fn resv(&self) -> u16 {
        be16(self.buffer.as_ref(), field::RESV)
    }
    /// Attribute modifier.
    pub fn attr_mod(&self) -> u32 {
        super::be_u32(self.buffer.as_ref(), field::ATTR_MOD.start)
    }
    /// The class data, 232 bytes.
    pub fn data(&self) -> &[u8; DATA_LEN] {
        self.buffer.as_ref()[HEADER_LEN..MAD_LEN]
            .try_into()
            .expect("new_checked saw 256 bytes")
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Mad<T> {
    /// The class data, to write.
    pub fn data_mut(&mut self) -> &mut [u8; DATA_LEN] {
        (&mut self.buffer.as_mut()[HEADER_LEN..MAD_LEN])
            .try_into()
            .expect("new_checked saw 256 bytes")
    }
}

/// A parsed common header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repr {
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method, with the response bit.
    pub method: u8,
    /// Status.
    pub status: u16,
    /// The class-specific word.
    pub class_specific: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute ID.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl Repr {
    /// Parses the common header; the base version must be 1.
    pub fn parse<T: AsRef<[u8]>>(m: &Mad<T>) -> Result<Repr> {
        if m.base_version() != BASE_VERSION {
            return Err(MadError::BadBaseVersion(m.base_version()));
        }
        Ok(Repr {
            mgmt_class: m.mgmt_class(),
            class_version: m.class_version(),
            method: m.method(),
            status: m.status(),
            class_specific: m.class_specific(),
            tid: m.tid(),
            attr_id: m.attr_id(),
            attr_mod: m.attr_mod(),
        })
    }
    /// Writes the common header (base version 1, the reserved word zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut Mad<T>) {
        let b = m.buffer.as_mut();
        b[field::BASE_VERSION] = BASE_VERSION;
        b[field::MGMT_CLASS] = self.mgmt_class;
        b[field::CLASS_VERSION] = self.class_version;
        b[field::METHOD] = self.method;
        b[field::STATUS].copy_from_slice(&self.status.to_be_bytes());
        b[field::CLASS_SPECIFIC].copy_from_slice(&self.class_specific.to_be_bytes());
        b[field::TID].copy_from_slice(&self.tid.to_be_bytes());
        b[field::ATTR_ID].copy_from_slice(&self.attr_id.to_be_bytes());
        b[field::RESV].fill(0);
        b[field::ATTR_MOD].copy_from_slice(&self.attr_mod.to_be_bytes());
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MAD class={:#04x} v{} method={:#04x} status={:#06x} TID={:#018x} attr={:#06x}",
            self.mgmt_class, self.class_version, self.method, self.status, self.tid, self.attr_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The common header of the REQ in write_bw_cm.pcap (frame 1): CM, class version 2, Send,
    // TID 0x2bb602d4a, attribute 0x0010.
    const REQ_HDR: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xbb, 0x60, 0x2d,
        0x4a, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn header_parse_emit() {
        let mut b = [0u8; MAD_LEN];
        b[..HEADER_LEN].copy_from_slice(&REQ_HDR);
        let r = Repr::parse(&Mad::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            Repr {
                mgmt_class: class::CM,
                class_version: 2,
                method: method::SEND,
                tid: 0x0000_0002_bb60_2d4a,
                attr_id: 0x0010,
                ..Repr::default()
            }
        );
        let mut out = [0xffu8; MAD_LEN];
        r.emit(&mut Mad::new_unchecked(&mut out[..]));
        assert_eq!(out[..HEADER_LEN], REQ_HDR);
    }

    #[test]
    fn short_and_foreign_mads() {
        let b = [1u8; MAD_LEN - 1];
        assert_eq!(Mad::new_checked(&b[..]), Err(MadError::Truncated));
        let mut b = [0u8; MAD_LEN];
        b[0] = 2;
        let m = Mad::new_checked(&b[..]).unwrap();
        assert_eq!(Repr::parse(&m), Err(MadError::BadBaseVersion(2)));
    }
}
