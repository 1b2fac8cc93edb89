//! Ethernet II with an optional 802.1Q tag.
//!
//! ```text
//! 0..6 dst | 6..12 src | [12..14 0x8100 | 14..16 PCP(3) DEI(1) VID(12)] | ethertype
//! ```

use super::{Error, Result};

/// Untagged header length.
pub const HEADER_LEN: usize = 14;
/// 802.1Q tag length.
pub const VLAN_TAG_LEN: usize = 4;
/// IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// 802.1Q.
pub const ETHERTYPE_VLAN: u16 = 0x8100;

/// An 802.1Q tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VlanTag {
    /// Priority code point (PFC priority).
    pub pcp: u8,
    /// Drop eligible.
    pub dei: bool,
    /// VLAN id.
    pub vid: u16,
}

impl VlanTag {
    #[inline]
    /// From the tag control information.
    pub fn from_tci(tci: u16) -> VlanTag {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }
    #[inline]
    /// The tag control information.
    pub fn tci(self) -> u16 {
        (self.pcp as u16 & 7) << 13 | (self.dei as u16) << 12 | (self.vid & 0x0fff)
    }
}

/// A zero-copy view of an Ethernet header, tagged or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    #[inline]
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Frame { buffer }
    }
    #[inline]
    /// Wraps a buffer, checking that the header (with its tag, if any) fits.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let f = Frame { buffer };
        let n = f.buffer.as_ref().len();
        if n < HEADER_LEN || (f.tpid() == ETHERTYPE_VLAN && n < HEADER_LEN + VLAN_TAG_LEN) {
            return Err(Error::Truncated);
        }
        Ok(f)
    }
    #[inline]
    /// Destination MAC.
    pub fn dst(&self) -> [u8; 6] {
        self.buffer.as_ref()[0..6].try_into().expect("6 bytes")
    }
    #[inline]
    /// Source MAC.
    pub fn src(&self) -> [u8; 6] {
        self.buffer.as_ref()[6..12].try_into().expect("6 bytes")
    }
    #[inline]
    fn tpid(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[12], b[13]])
    }
    #[inline]
    /// The 802.1Q tag, if the frame has one.
    pub fn vlan(&self) -> Option<VlanTag> {
        let b = self.buffer.as_ref();
        (self.tpid() == ETHERTYPE_VLAN && b.len() >= 16)
            .then(|| VlanTag::from_tci(u16::from_be_bytes([b[14], b[15]])))
    }
    #[inline]
    /// Header length: 14, or 18 with a tag.
    pub fn header_len(&self) -> usize {
        if self.tpid() == ETHERTYPE_VLAN {
            HEADER_LEN + VLAN_TAG_LEN
        } else {
            HEADER_LEN
        }
    }
    #[inline]
    /// The ethertype after any tag.
    pub fn ethertype(&self) -> u16 {
        let b = self.buffer.as_ref();
        let at = self.header_len() - 2;
        u16::from_be_bytes([b[at], b[at + 1]])
    }
    #[inline]
    /// What follows the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

/// A parsed Ethernet header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// 802.1Q tag.
    pub vlan: Option<VlanTag>,
    /// Ethertype.
    pub ethertype: u16,
}

impl Repr {
    #[inline]
    /// Parses the header.
    pub fn parse<T: AsRef<[u8]>>(f: &Frame<T>) -> Result<Repr> {
        Ok(Repr {
            dst: f.dst(),
            src: f.src(),
            vlan: f.vlan(),
            ethertype: f.ethertype(),
        })
    }
    #[inline]
    /// Header length.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + if self.vlan.is_some() { VLAN_TAG_LEN } else { 0 }
    }
    #[inline]
    /// Writes the header at the start of `b`.
    pub fn emit(&self, b: &mut [u8]) {
        b[0..6].copy_from_slice(&self.dst);
        b[6..12].copy_from_slice(&self.src);
        let mut at = 12;
        if let Some(t) = self.vlan {
            b[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            b[14..16].copy_from_slice(&t.tci().to_be_bytes());
            at = 16;
        }
        b[at..at + 2].copy_from_slice(&self.ethertype.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_and_untagged_roundtrip() {
        let mut tagged = [0u8; 18];
        let r = Repr {
            dst: [1; 6],
            src: [2; 6],
            vlan: Some(VlanTag {
                pcp: 3,
                dei: false,
                vid: 100,
            }),
            ethertype: ETHERTYPE_IPV4,
        };
        r.emit(&mut tagged);
        assert_eq!(&tagged[12..18], &[0x81, 0x00, 0x60, 0x64, 0x08, 0x00]);
        let f = Frame::new_checked(&tagged[..]).unwrap();
        assert_eq!(Repr::parse(&f).unwrap(), r);
        assert_eq!(f.header_len(), 18);
        // A tag whose header is cut short anywhere (found by fuzzing at 15 bytes).
        for cut in 14..18 {
            assert!(Frame::new_checked(&tagged[..cut]).is_err(), "{cut}");
        }
        let u = Repr { vlan: None, ..r };
        let mut b = [0u8; 14];
        u.emit(&mut b);
        assert_eq!(
            Repr::parse(&Frame::new_checked(&b[..]).unwrap()).unwrap(),
            u
        );
    }
}
