//! The BTH opcode table, in the style of rxe's `rxe_opcode.c`: for each of the 256 opcodes its
//! name, a mask of properties, and the offsets of the extension headers that follow the BTH.
//! Parsing and building consult the table instead of scattered matches.
//!
//! Extension headers always come in the order the IBTA fixes: DETH, RETH, AtomicETH, AETH,
//! AtomicAckETH, ImmDt, IETH; so their offsets follow from which are present.

use super::{aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth};

/// Property bits of an opcode.
pub mod mask {
    /// A valid opcode for this implementation.
    pub const VALID: u32 = 1 << 0;
    /// Followed by a DETH.
    pub const DETH: u32 = 1 << 1;
    /// Followed by a RETH.
    pub const RETH: u32 = 1 << 2;
    /// Followed by an AtomicETH.
    pub const ATMETH: u32 = 1 << 3;
    /// Followed by an AETH.
    pub const AETH: u32 = 1 << 4;
    /// Followed by an AtomicAckETH.
    pub const ATMACK: u32 = 1 << 5;
    /// Followed by an ImmDt.
    pub const IMMDT: u32 = 1 << 6;
    /// Followed by an IETH.
    pub const IETH: u32 = 1 << 7;
    /// Carries payload.
    pub const PAYLOAD: u32 = 1 << 8;
    /// A request (requester to responder).
    pub const REQ: u32 = 1 << 9;
    /// A response or acknowledgement (responder to requester).
    pub const ACK: u32 = 1 << 10;
    /// Part of a SEND.
    pub const SEND: u32 = 1 << 11;
    /// Part of an RDMA WRITE.
    pub const WRITE: u32 = 1 << 12;
    /// RDMA READ request or response.
    pub const READ: u32 = 1 << 13;
    /// Atomic request or acknowledgement.
    pub const ATOMIC: u32 = 1 << 14;
    /// First packet of a message.
    pub const FIRST: u32 = 1 << 15;
    /// Middle packet.
    pub const MIDDLE: u32 = 1 << 16;
    /// Last packet.
    pub const LAST: u32 = 1 << 17;
    /// Only packet (first and last).
    pub const ONLY: u32 = FIRST | LAST;
    /// Consumes a receive WQE at the responder (SEND, WRITE with immediate).
    pub const RWR: u32 = 1 << 18;
    /// Completes a message (generates a completion where one is asked for).
    pub const COMP: u32 = 1 << 19;
    /// Reliable connection.
    pub const RC: u32 = 1 << 20;
    /// Unreliable connection.
    pub const UC: u32 = 1 << 21;
    /// Unreliable datagram.
    pub const UD: u32 = 1 << 22;
    /// RoCEv2 congestion notification packet.
    pub const CNP: u32 = 1 << 23;
}

/// What the table says of one opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// Name as rxe and Wireshark spell it, `"RC RDMA WRITE First"`...
    pub name: &'static str,
    /// Property bits from [`mask`].
    pub mask: u32,
    /// Bytes of BTH plus extension headers (the payload starts here).
    pub length: u8,
    /// Offset of each extension header from the start of the BTH (0 if absent).
    pub offset: Offsets,
}

/// Extension header offsets from the BTH's first byte; 0 means absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offsets {
    /// DETH.
    pub deth: u8,
    /// RETH.
    pub reth: u8,
    /// AtomicETH.
    pub atmeth: u8,
    /// AETH.
    pub aeth: u8,
    /// AtomicAckETH.
    pub atmack: u8,
    /// ImmDt.
    pub immdt: u8,
    /// IETH.
    pub ieth: u8,
}

impl OpInfo {
    /// True if every bit of `m` is set.
    #[inline]
    pub const fn has(&self, m: u32) -> bool {
        self.mask & m == m
    }
    /// True for an opcode this implementation knows.
    #[inline]
    pub const fn is_valid(&self) -> bool {
        self.mask & mask::VALID != 0
    }
}

const fn info(name: &'static str, m: u32) -> OpInfo {
    let mut off = Offsets {
        deth: 0,
        reth: 0,
        atmeth: 0,
        aeth: 0,
        atmack: 0,
        immdt: 0,
        ieth: 0,
    };
    let mut at = bth::HEADER_LEN;
    if m & mask::DETH != 0 {
        off.deth = at as u8;
        at += deth::HEADER_LEN;
    }
    if m & mask::RETH != 0 {
        off.reth = at as u8;
        at += reth::HEADER_LEN;
    }
    if m & mask::ATMETH != 0 {
        off.atmeth = at as u8;
        at += atomic_eth::HEADER_LEN;
    }
    if m & mask::AETH != 0 {
        off.aeth = at as u8;
        at += aeth::HEADER_LEN;
    }
    if m & mask::ATMACK != 0 {
        off.atmack = at as u8;
        at += atomic_ack_eth::HEADER_LEN;
    }
    if m & mask::IMMDT != 0 {
        off.immdt = at as u8;
        at += immdt::HEADER_LEN;
    }
    if m & mask::IETH != 0 {
        off.ieth = at as u8;
        at += ieth::HEADER_LEN;
    }
    if m & mask::CNP != 0 {
        at += super::cnp::RESERVED_LEN;
    }
    OpInfo {
        name,
        mask: m | mask::VALID,
        length: at as u8,
        offset: off,
    }
}

const UNKNOWN: OpInfo = OpInfo {
    name: "UNKNOWN",
    mask: 0,
    length: 0,
    offset: Offsets {
        deth: 0,
        reth: 0,
        atmeth: 0,
        aeth: 0,
        atmack: 0,
        immdt: 0,
        ieth: 0,
    },
};

use mask::*;

const fn entry(op: u8) -> OpInfo {
    const RQ: u32 = REQ;
    match op {
        // Reliable connection.
        0x00 => info("RC SEND First", RC | RQ | SEND | PAYLOAD | FIRST | RWR),
        0x01 => info("RC SEND Middle", RC | RQ | SEND | PAYLOAD | MIDDLE),
        0x02 => info("RC SEND Last", RC | RQ | SEND | PAYLOAD | LAST | COMP),
        0x03 => info(
            "RC SEND Last with Immediate",
            RC | RQ | SEND | PAYLOAD | LAST | COMP | IMMDT,
        ),
        0x04 => info("RC SEND Only", RC | RQ | SEND | PAYLOAD | ONLY | RWR | COMP),
        0x05 => info(
            "RC SEND Only with Immediate",
            RC | RQ | SEND | PAYLOAD | ONLY | RWR | COMP | IMMDT,
        ),
        0x06 => info(
            "RC RDMA WRITE First",
            RC | RQ | WRITE | PAYLOAD | FIRST | RETH,
        ),
        0x07 => info("RC RDMA WRITE Middle", RC | RQ | WRITE | PAYLOAD | MIDDLE),
        0x08 => info("RC RDMA WRITE Last", RC | RQ | WRITE | PAYLOAD | LAST),
        0x09 => info(
            "RC RDMA WRITE Last with Immediate",
            RC | RQ | WRITE | PAYLOAD | LAST | IMMDT | RWR | COMP,
        ),
        0x0a => info(
            "RC RDMA WRITE Only",
            RC | RQ | WRITE | PAYLOAD | ONLY | RETH,
        ),
        0x0b => info(
            "RC RDMA WRITE Only with Immediate",
            RC | RQ | WRITE | PAYLOAD | ONLY | RETH | IMMDT | RWR | COMP,
        ),
        0x0c => info("RC RDMA READ Request", RC | RQ | READ | ONLY | RETH),
        0x0d => info(
            "RC RDMA READ Response First",
            RC | ACK | READ | PAYLOAD | FIRST | AETH,
        ),
        0x0e => info(
            "RC RDMA READ Response Middle",
            RC | ACK | READ | PAYLOAD | MIDDLE,
        ),
        0x0f => info(
            "RC RDMA READ Response Last",
            RC | ACK | READ | PAYLOAD | LAST | AETH,
        ),
        0x10 => info(
            "RC RDMA READ Response Only",
            RC | ACK | READ | PAYLOAD | ONLY | AETH,
        ),
        0x11 => info("RC Acknowledge", RC | ACK | ONLY | AETH),
        0x12 => info(
            "RC Atomic Acknowledge",
            RC | ACK | ATOMIC | ONLY | AETH | ATMACK,
        ),
        0x13 => info("RC CmpSwap", RC | RQ | ATOMIC | ONLY | ATMETH),
        0x14 => info("RC FetchAdd", RC | RQ | ATOMIC | ONLY | ATMETH),
        0x16 => info(
            "RC SEND Last with Invalidate",
            RC | RQ | SEND | PAYLOAD | LAST | COMP | IETH,
        ),
        0x17 => info(
            "RC SEND Only with Invalidate",
            RC | RQ | SEND | PAYLOAD | ONLY | RWR | COMP | IETH,
        ),
        // Unreliable connection.
        0x20 => info("UC SEND First", UC | RQ | SEND | PAYLOAD | FIRST | RWR),
        0x21 => info("UC SEND Middle", UC | RQ | SEND | PAYLOAD | MIDDLE),
        0x22 => info("UC SEND Last", UC | RQ | SEND | PAYLOAD | LAST | COMP),
        0x23 => info(
            "UC SEND Last with Immediate",
            UC | RQ | SEND | PAYLOAD | LAST | COMP | IMMDT,
        ),
        0x24 => info("UC SEND Only", UC | RQ | SEND | PAYLOAD | ONLY | RWR | COMP),
        0x25 => info(
            "UC SEND Only with Immediate",
            UC | RQ | SEND | PAYLOAD | ONLY | RWR | COMP | IMMDT,
        ),
        0x26 => info(
            "UC RDMA WRITE First",
            UC | RQ | WRITE | PAYLOAD | FIRST | RETH,
        ),
        0x27 => info("UC RDMA WRITE Middle", UC | RQ | WRITE | PAYLOAD | MIDDLE),
        0x28 => info("UC RDMA WRITE Last", UC | RQ | WRITE | PAYLOAD | LAST),
        0x29 => info(
            "UC RDMA WRITE Last with Immediate",
            UC | RQ | WRITE | PAYLOAD | LAST | IMMDT | RWR | COMP,
        ),
        0x2a => info(
            "UC RDMA WRITE Only",
            UC | RQ | WRITE | PAYLOAD | ONLY | RETH,
        ),
        0x2b => info(
            "UC RDMA WRITE Only with Immediate",
            UC | RQ | WRITE | PAYLOAD | ONLY | RETH | IMMDT | RWR | COMP,
        ),
        // Unreliable datagram.
        0x64 => info(
            "UD SEND Only",
            UD | RQ | SEND | PAYLOAD | ONLY | DETH | RWR | COMP,
        ),
        0x65 => info(
            "UD SEND Only with Immediate",
            UD | RQ | SEND | PAYLOAD | ONLY | DETH | IMMDT | RWR | COMP,
        ),
        // RoCEv2 congestion notification.
        0x81 => info("CNP", CNP | ONLY),
        _ => UNKNOWN,
    }
}

const fn build() -> [OpInfo; 256] {
    let mut t = [UNKNOWN; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = entry(i as u8);
        i += 1;
    }
    t
}

/// The table, indexed by opcode.
pub static OPCODES: [OpInfo; 256] = build();

/// What the table says of `op`.
#[inline]
pub fn lookup(op: u8) -> &'static OpInfo {
    &OPCODES[op as usize]
}

/// Opcodes by name, for code that builds packets.
pub mod op {
    #![allow(missing_docs)]
    pub const RC_SEND_FIRST: u8 = 0x00;
    pub const RC_SEND_MIDDLE: u8 = 0x01;
    pub const RC_SEND_LAST: u8 = 0x02;
    pub const RC_SEND_LAST_IMM: u8 = 0x03;
    pub const RC_SEND_ONLY: u8 = 0x04;
    pub const RC_SEND_ONLY_IMM: u8 = 0x05;
    pub const RC_WRITE_FIRST: u8 = 0x06;
    pub const RC_WRITE_MIDDLE: u8 = 0x07;
    pub const RC_WRITE_LAST: u8 = 0x08;
    pub const RC_WRITE_LAST_IMM: u8 = 0x09;
    pub const RC_WRITE_ONLY: u8 = 0x0a;
    pub const RC_WRITE_ONLY_IMM: u8 = 0x0b;
    pub const RC_READ_REQUEST: u8 = 0x0c;
    pub const RC_READ_RESPONSE_FIRST: u8 = 0x0d;
    pub const RC_READ_RESPONSE_MIDDLE: u8 = 0x0e;
    pub const RC_READ_RESPONSE_LAST: u8 = 0x0f;
    pub const RC_READ_RESPONSE_ONLY: u8 = 0x10;
    pub const RC_ACK: u8 = 0x11;
    pub const RC_ATOMIC_ACK: u8 = 0x12;
    pub const RC_CMP_SWAP: u8 = 0x13;
    pub const RC_FETCH_ADD: u8 = 0x14;
    pub const RC_SEND_LAST_INV: u8 = 0x16;
    pub const RC_SEND_ONLY_INV: u8 = 0x17;
    pub const UD_SEND_ONLY: u8 = 0x64;
    pub const UD_SEND_ONLY_IMM: u8 = 0x65;
    pub const CNP: u8 = 0x81;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_lengths_follow_the_header_order() {
        let w = lookup(op::RC_WRITE_ONLY_IMM);
        assert_eq!((w.offset.reth, w.offset.immdt, w.length), (12, 28, 32));
        let a = lookup(op::RC_ATOMIC_ACK);
        assert_eq!((a.offset.aeth, a.offset.atmack, a.length), (12, 16, 24));
        let c = lookup(op::RC_CMP_SWAP);
        assert_eq!((c.offset.atmeth, c.length), (12, 40));
        let u = lookup(op::UD_SEND_ONLY_IMM);
        assert_eq!((u.offset.deth, u.offset.immdt, u.length), (12, 20, 24));
        assert_eq!(lookup(op::CNP).length, 28);
        assert_eq!(lookup(op::RC_READ_RESPONSE_MIDDLE).length, 12);
        assert!(lookup(op::RC_SEND_ONLY).has(mask::ONLY | mask::SEND | mask::RC));
        assert!(!lookup(0x15).is_valid());
        assert!(!lookup(0xff).is_valid());
        let known = OPCODES.iter().filter(|o| o.is_valid()).count();
        assert_eq!(known, 23 + 12 + 2 + 1);
    }

    #[test]
    fn ext_combinations() {
        // The extension headers come in these combinations only: the build's emit_ext and the
        // parse's decode go by them (a first header, then at most the one that may follow it).
        use mask::*;
        let allowed = [
            0,
            RETH,
            RETH | IMMDT,
            DETH,
            DETH | IMMDT,
            AETH,
            AETH | ATMACK,
            ATMETH,
            IMMDT,
            IETH,
            CNP,
        ];
        let ext = DETH | RETH | ATMETH | AETH | ATMACK | IMMDT | IETH | CNP;
        for (code, o) in OPCODES.iter().enumerate() {
            if o.is_valid() {
                assert!(
                    allowed.contains(&(o.mask & ext)),
                    "opcode {code:#x}: {}",
                    o.name
                );
            }
        }
    }
}
