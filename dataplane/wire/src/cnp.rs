//! The RoCEv2 Congestion Notification Packet: a BTH with opcode 0x81 and BECN set, then 16
//! reserved bytes, then the ICRC. Its destination QP is the QP whose traffic was marked.

use super::{bth, psn::Psn};

/// Bytes of reserved data after the BTH.
pub const RESERVED_LEN: usize = 16;

/// The BTH of a CNP to `dest_qp`, as NICs send it (P_Key default, PSN 0, BECN set).
pub fn bth(dest_qp: u32, pkey: u16) -> bth::Repr {
    bth::Repr {
        opcode: super::opcode::op::CNP,
        pkey,
        becn: true,
        dest_qp,
        psn: Psn::new(0),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cnp_bth_has_becn_and_opcode() {
        let r = bth(0x12, 0xffff);
        let mut b = [0u8; 12];
        r.emit(&mut bth::Header::new_unchecked(&mut b[..]));
        assert_eq!(b[0], 0x81);
        assert_eq!(b[4] & 0x40, 0x40);
        assert_eq!(&b[5..8], &[0, 0, 0x12]);
        assert_eq!(
            super::super::opcode::lookup(0x81).length as usize,
            12 + RESERVED_LEN
        );
    }
}
