//! The entries of the application rings, as fixed little-endian byte layouts.
//!
//! Opcodes and flags take libibverbs' values (`IBV_WR_*`, `IBV_SEND_*`, `IBV_WC_*`), so the
//! compatibility library passes them through. Entries are decoded from a private copy of their
//! slot ([`crate::ring::Consumer::pop`]) and refused field by field: an unknown opcode or flag, more
//! scatter/gather entries than a slot or the device holds, inline data past the slot. What a
//! refused entry would have done is nothing; its QP reports the error (a completion in error,
//! the QP in ERR), and no other QP notices.
//!
//! A send work queue entry is a 64-byte header, then either `num_sge` scatter/gather entries of
//! 16 bytes (address, length, local key) or `inline_len` bytes of inline data:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | wr_id |
//! | 8 | opcode (`IBV_WR_*`) |
//! | 9 | send flags (`IBV_SEND_FENCE` 1, `SIGNALED` 2, `SOLICITED` 4, `INLINE` 8) |
//! | 10 | num_sge |
//! | 12..16 | immediate data, or the key a SEND with invalidate names |
//! | 16..24, 24..28 | remote address and key (WRITE, READ, atomics) |
//! | 28..32 | inline_len |
//! | 32..40, 40..48 | compare-or-add and swap operands (atomics) |
//! | 48..52, 52..56, 56..60 | UD: remote QPN, Q_Key, address handle |
//!
//! A receive entry is a 16-byte header (wr_id, num_sge at byte 8) and its scatter/gather entries.
//! A completion entry is 32 bytes: wr_id, byte_len (8..12), immediate data or invalidated key
//! (12..16), qp_num (16..20), src_qp (20..24), status (24), opcode (25), flags (26:
//! `IBV_WC_GRH` 1 on UD receives, `IBV_WC_WITH_IMM` 2, `IBV_WC_WITH_INV` 4).

use arrayvec::ArrayVec;

/// Scatter/gather entries one work request may carry (the device's max_sge).
pub const MAX_SGE: usize = 8;
/// READs and atomics a QP may have outstanding either way (the device's `max_qp_rd_atom` and
/// `max_qp_init_rd_atom`).
pub const MAX_RD_ATOMIC: u8 = 128;
/// Inline bytes one send work request may carry (the device's max_inline_data).
pub const MAX_INLINE: usize = 512;
/// Bytes of a send entry's header.
pub const SEND_HEADER: usize = 64;
/// Bytes of a receive entry's header.
pub const RECV_HEADER: usize = 16;
/// Bytes of a scatter/gather entry.
pub const SGE_BYTES: usize = 16;
/// Bytes of a completion entry.
pub const CQE_BYTES: usize = 32;

/// What a send work request does (`enum ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum WrOpcode {
    /// IBV_WR_RDMA_WRITE.
    Write = 0,
    /// IBV_WR_RDMA_WRITE_WITH_IMM.
    WriteWithImm = 1,
    /// IBV_WR_SEND.
    Send = 2,
    /// IBV_WR_SEND_WITH_IMM.
    SendWithImm = 3,
    /// IBV_WR_RDMA_READ.
    Read = 4,
    /// IBV_WR_ATOMIC_CMP_AND_SWP.
    CmpSwap = 5,
    /// IBV_WR_ATOMIC_FETCH_AND_ADD.
    FetchAdd = 6,
    /// IBV_WR_SEND_WITH_INV.
    SendWithInv = 9,
}

impl WrOpcode {
    /// The opcode of an `IBV_WR_*` value, if ferroce offers it.
    pub fn from_u8(v: u8) -> Option<WrOpcode> {
        use WrOpcode::*;
        Some(match v {
            0 => Write,
            1 => WriteWithImm,
            2 => Send,
            3 => SendWithImm,
            4 => Read,
            5 => CmpSwap,
            6 => FetchAdd,
            9 => SendWithInv,
            _ => return None,
        })
    }
}

/// Send flags (`enum ibv_send_flags`).
pub mod send_flags {
    /// IBV_SEND_FENCE: wait for earlier READs and atomics.
    pub const FENCE: u8 = 1;
    /// IBV_SEND_SIGNALED: complete with a completion entry.
    pub const SIGNALED: u8 = 2;
    /// IBV_SEND_SOLICITED: ask the responder to raise an event.
    pub const SOLICITED: u8 = 4;
    /// IBV_SEND_INLINE: the payload follows the header.
    pub const INLINE: u8 = 8;
    /// Every flag known.
    pub const ALL: u8 = FENCE | SIGNALED | SOLICITED | INLINE;
}

/// A scatter/gather entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address in the application's registered memory.
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// Local key of its region.
    pub lkey: u32,
}

/// Where a UD send goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdTarget {
    /// The remote QP.
    pub remote_qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// The address handle (created through the control socket).
    pub ah: u32,
}

/// A send work queue entry, decoded: nothing allocated, the inline payload borrowed from the
/// private copy of the slot it was decoded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWqe<'a> {
    /// Returned in its completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: WrOpcode,
    /// [`send_flags`].
    pub flags: u8,
    /// Immediate data (WITH_IMM) or the key to invalidate (SEND_WITH_INV).
    pub imm: u32,
    /// Remote address (WRITE, READ, atomics).
    pub remote_addr: u64,
    /// Remote key (WRITE, READ, atomics).
    pub rkey: u32,
    /// Compare (CMP_SWAP) or add (FETCH_ADD) operand.
    pub compare_add: u64,
    /// Swap operand (CMP_SWAP).
    pub swap: u64,
    /// UD only.
    pub ud: UdTarget,
    /// Its scatter/gather list (empty when inline).
    pub sg: ArrayVec<Sge, MAX_SGE>,
    /// Its inline payload (when [`send_flags::INLINE`]).
    pub inline: &'a [u8],
}

/// Why an entry was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AbiError {
    /// Shorter than its header.
    #[error("entry of {0} bytes is shorter than its header")]
    Short(usize),
    /// Not an opcode of a send work request.
    #[error("unknown send opcode {0}")]
    Opcode(u8),
    /// A flag bit that means nothing.
    #[error("unknown send flags {0:#04x}")]
    Flags(u8),
    /// Too many scatter/gather entries, for the device or for the slot.
    #[error("{0} scatter/gather entries: at most {MAX_SGE}, and as many as the slot holds")]
    TooManySge(u8),
    /// Inline data too long, for the device or for the slot.
    #[error("{0} inline bytes: at most {MAX_INLINE}, and as many as the slot holds")]
    InlineTooLong(u32),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Sge {
    /// The entry in its 16 bytes.
    #[inline(always)]
    pub fn from_bytes(b: &[u8; SGE_BYTES]) -> Sge {
        Sge {
            addr: u64::from_le_bytes(get(b, 0)),
            length: u32::from_le_bytes(get(b, 8)),
            lkey: u32::from_le_bytes(get(b, 12)),
        }
    }
}

fn sge_at(b: &[u8], at: usize) -> Sge {
    Sge {
        addr: u64_at(b, at),
        length: u32_at(b, at + 8),
        lkey: u32_at(b, at + 12),
    }
}

fn sges(b: &[u8], from: usize, n: u8) -> Result<ArrayVec<Sge, MAX_SGE>, AbiError> {
    if n as usize > MAX_SGE || from + n as usize * SGE_BYTES > b.len() {
        return Err(AbiError::TooManySge(n));
    }
    Ok((0..n as usize)
        .map(|i| sge_at(b, from + i * SGE_BYTES))
        .collect())
}

/// Writes `v` at `at` of a fixed-size buffer (`at + N` within it, so the bounds fold away).
#[inline(always)]
fn put<const L: usize, const N: usize>(b: &mut [u8; L], at: usize, v: [u8; N]) {
    b[at..at + N].copy_from_slice(&v);
}

/// A scatter/gather entry's 16 bytes.
#[inline(always)]
fn sge_bytes(s: &Sge) -> [u8; SGE_BYTES] {
    let mut b = [0u8; SGE_BYTES];
    put(&mut b, 0, s.addr.to_le_bytes());
    put(&mut b, 8, s.length.to_le_bytes());
    put(&mut b, 12, s.lkey.to_le_bytes());
    b
}

fn put_sges(out: &mut [u8], from: usize, sg: &[Sge]) {
    for (s, o) in sg.iter().zip(out[from..].chunks_exact_mut(SGE_BYTES)) {
        o.copy_from_slice(&sge_bytes(s));
    }
}

impl<'a> SendWqe<'a> {
    /// Bytes this entry takes in a slot.
    pub fn encoded_len(&self) -> usize {
        SEND_HEADER
            + if self.flags & send_flags::INLINE != 0 {
                self.inline.len()
            } else {
                self.sg.len() * SGE_BYTES
            }
    }

    /// Writes the entry into `out` (at least [`SendWqe::encoded_len`] bytes); `Err` if its
    /// inline payload is longer than the device takes or `out` is short. (Inlined: it runs
    /// once a post, and its call cost a fifth of it.)
    #[inline]
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, AbiError> {
        if self.inline.len() > MAX_INLINE {
            return Err(AbiError::InlineTooLong(self.inline.len() as u32));
        }
        let n = self.encoded_len();
        if out.len() < n {
            return Err(AbiError::Short(out.len()));
        }
        let inline = self.flags & send_flags::INLINE != 0;
        // The header is written through a fixed-size array where it goes: fixed offsets, no
        // bounds to check field by field (this took 87 instructions a post as slice writes,
        // 30 built in a local array and copied, fewer as this).
        let (h, rest) = out
            .split_first_chunk_mut::<SEND_HEADER>()
            .ok_or(AbiError::Short(n))?;
        put(h, 0, self.wr_id.to_le_bytes());
        h[8] = self.opcode as u8;
        h[9] = self.flags;
        h[10] = if inline { 0 } else { self.sg.len() as u8 };
        h[11] = 0;
        put(h, 12, self.imm.to_le_bytes());
        put(h, 16, self.remote_addr.to_le_bytes());
        put(h, 24, self.rkey.to_le_bytes());
        let inline_len = if inline { self.inline.len() as u32 } else { 0 };
        put(h, 28, inline_len.to_le_bytes());
        put(h, 32, self.compare_add.to_le_bytes());
        put(h, 40, self.swap.to_le_bytes());
        put(h, 48, self.ud.remote_qpn.to_le_bytes());
        put(h, 52, self.ud.qkey.to_le_bytes());
        put(h, 56, self.ud.ah.to_le_bytes());
        put(h, 60, [0u8; 4]);
        if inline {
            rest[..self.inline.len()].copy_from_slice(self.inline);
        } else {
            let (sges, _) = rest.as_chunks_mut::<SGE_BYTES>();
            match (&self.sg[..], sges) {
                // The common list of one entry without a loop's setup.
                ([s], [o, ..]) => *o = sge_bytes(s),
                (sg, sges) => {
                    for (s, o) in sg.iter().zip(sges) {
                        *o = sge_bytes(s);
                    }
                }
            }
        }
        Ok(n)
    }

    /// Decodes the entry in `slot` (a private copy of a ring slot): [`SendView::new_checked`]
    /// and every field read.
    pub fn decode(slot: &'a [u8]) -> Result<SendWqe<'a>, AbiError> {
        let v = SendView::new_checked(slot)?;
        Ok(SendWqe {
            wr_id: v.wr_id(),
            opcode: v.opcode(),
            flags: v.flags(),
            imm: v.imm(),
            remote_addr: v.remote_addr(),
            rkey: v.rkey(),
            compare_add: v.compare_add(),
            swap: v.swap(),
            ud: v.ud(),
            sg: v.sges().collect(),
            inline: v.inline(),
        })
    }
}

/// A send work queue entry read where it lies (smoltcp's checked view): what the lcore uses,
/// copying no field it does not need. The header is a fixed-size array, so its fields are read
/// at constant offsets with nothing to check; what follows it (scatter/gather entries or inline
/// bytes) is checked once against its length. After [`SendView::new_checked`] or
/// [`SendView::from_parts`] no accessor can panic.
#[derive(Clone, Copy, Debug)]
pub struct SendView<'a> {
    h: &'a [u8; SEND_HEADER],
    rest: &'a [u8],
    opcode: WrOpcode,
}

#[inline(always)]
fn get<const L: usize, const N: usize>(b: &[u8; L], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("N bytes")
}

impl<'a> SendView<'a> {
    /// A view of the entry in `slot`, refused if a field is out of range: an unknown opcode or
    /// flag, more scatter/gather entries than [`MAX_SGE`] or the slot holds, inline data past
    /// [`MAX_INLINE`] or the slot.
    pub fn new_checked(slot: &'a [u8]) -> Result<SendView<'a>, AbiError> {
        let (h, rest) = slot
            .split_first_chunk::<SEND_HEADER>()
            .ok_or(AbiError::Short(slot.len()))?;
        Self::from_parts(h, rest)
    }

    /// The same, of an entry whose header and what follows it were copied apart (see
    /// [`SendView::body_len`]).
    #[inline]
    pub fn from_parts(h: &'a [u8; SEND_HEADER], rest: &'a [u8]) -> Result<SendView<'a>, AbiError> {
        let opcode = WrOpcode::from_u8(h[8]).ok_or(AbiError::Opcode(h[8]))?;
        let flags = h[9];
        if flags & !send_flags::ALL != 0 {
            return Err(AbiError::Flags(flags));
        }
        if flags & send_flags::INLINE != 0 {
            let len = u32::from_le_bytes(get(h, 28));
            if len as usize > MAX_INLINE || len as usize > rest.len() {
                return Err(AbiError::InlineTooLong(len));
            }
        } else {
            let n = h[10];
            if n as usize > MAX_SGE || n as usize * SGE_BYTES > rest.len() {
                return Err(AbiError::TooManySge(n));
            }
        }
        Ok(SendView { h, rest, opcode })
    }

    /// Bytes after the header that the entry with header `h` says it uses (its scatter/gather
    /// entries or its inline data; not yet checked: the caller copies at most the slot's
    /// worth, and [`SendView::from_parts`] checks).
    #[inline]
    pub fn body_len(h: &[u8; SEND_HEADER]) -> usize {
        if h[9] & send_flags::INLINE != 0 {
            u32::from_le_bytes(get(h, 28)) as usize
        } else {
            h[10] as usize * SGE_BYTES
        }
    }

    /// Returned in its completion.
    pub fn wr_id(&self) -> u64 {
        u64::from_le_bytes(get(self.h, 0))
    }
    /// The operation.
    pub fn opcode(&self) -> WrOpcode {
        self.opcode
    }
    /// [`send_flags`].
    pub fn flags(&self) -> u8 {
        self.h[9]
    }
    /// Immediate data or the key to invalidate.
    pub fn imm(&self) -> u32 {
        u32::from_le_bytes(get(self.h, 12))
    }
    /// Remote address.
    pub fn remote_addr(&self) -> u64 {
        u64::from_le_bytes(get(self.h, 16))
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        u32::from_le_bytes(get(self.h, 24))
    }
    /// Compare or add operand.
    pub fn compare_add(&self) -> u64 {
        u64::from_le_bytes(get(self.h, 32))
    }
    /// Swap operand.
    pub fn swap(&self) -> u64 {
        u64::from_le_bytes(get(self.h, 40))
    }
    /// UD's target (all zero on RC).
    pub fn ud(&self) -> UdTarget {
        UdTarget {
            remote_qpn: u32::from_le_bytes(get(self.h, 48)),
            qkey: u32::from_le_bytes(get(self.h, 52)),
            ah: u32::from_le_bytes(get(self.h, 56)),
        }
    }
    /// Its scatter/gather entries as they lie (none when inline): fixed-size, so that each
    /// decodes at constant offsets ([`Sge::from_bytes`]).
    #[inline]
    pub fn sge_bytes(&self) -> &'a [[u8; SGE_BYTES]] {
        let n = if self.h[9] & send_flags::INLINE != 0 {
            0
        } else {
            self.h[10] as usize
        };
        let (c, _) = self.rest.as_chunks::<SGE_BYTES>();
        // Checked in `from_parts`: the entries are there.
        &c[..n.min(c.len())]
    }

    /// Its scatter/gather entries (none when inline).
    pub fn sges(&self) -> impl Iterator<Item = Sge> + 'a {
        self.sge_bytes().iter().map(Sge::from_bytes)
    }
    /// Its inline payload (empty unless [`send_flags::INLINE`]).
    pub fn inline(&self) -> &'a [u8] {
        if self.h[9] & send_flags::INLINE == 0 {
            return &[];
        }
        let len = u32::from_le_bytes(get(self.h, 28)) as usize;
        &self.rest[..len]
    }
}

/// A receive work queue entry, decoded (nothing allocated).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecvWqe {
    /// Returned in its completion.
    pub wr_id: u64,
    /// Where the message lands.
    pub sg: ArrayVec<Sge, MAX_SGE>,
}

impl RecvWqe {
    /// Writes the entry into `out`; its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, AbiError> {
        let n = RECV_HEADER + self.sg.len() * SGE_BYTES;
        if out.len() < n {
            return Err(AbiError::Short(out.len()));
        }
        out[..RECV_HEADER].fill(0);
        out[0..8].copy_from_slice(&self.wr_id.to_le_bytes());
        out[8] = self.sg.len() as u8;
        put_sges(out, RECV_HEADER, &self.sg);
        Ok(n)
    }

    /// Bytes after the header that the entry with header `h` says it uses (its
    /// scatter/gather entries; not yet checked, as [`SendView::body_len`]).
    #[inline]
    pub fn body_len(h: &[u8; RECV_HEADER]) -> usize {
        h[8] as usize * SGE_BYTES
    }

    /// Decodes the entry in `slot`.
    pub fn decode(slot: &[u8]) -> Result<RecvWqe, AbiError> {
        if slot.len() < RECV_HEADER {
            return Err(AbiError::Short(slot.len()));
        }
        Ok(RecvWqe {
            wr_id: u64_at(slot, 0),
            sg: sges(slot, RECV_HEADER, slot[8])?,
        })
    }
}

/// A completion entry (the fields of `struct ibv_wc` the rings carry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// The work request's id.
    pub wr_id: u64,
    /// Bytes received (receives, READs, atomics).
    pub byte_len: u32,
    /// Immediate data or the invalidated key, as `flags` says.
    pub imm: u32,
    /// The local QP.
    pub qp_num: u32,
    /// UD: the sender's QP.
    pub src_qp: u32,
    /// `enum ibv_wc_status`.
    pub status: u8,
    /// `enum ibv_wc_opcode`.
    pub opcode: u8,
    /// `IBV_WC_GRH` (1), `IBV_WC_WITH_IMM` (2), `IBV_WC_WITH_INV` (4).
    pub flags: u8,
}

impl Cqe {
    /// The entry as bytes.
    pub fn encode(&self) -> [u8; CQE_BYTES] {
        let mut b = [0u8; CQE_BYTES];
        self.encode_into(&mut b);
        b
    }

    /// Writes the entry over `b`, every byte of it (where it goes in a ring slot: see
    /// [`crate::ring::Producer::stage_fixed`]).
    #[inline]
    pub fn encode_into(&self, b: &mut [u8; CQE_BYTES]) {
        put(b, 0, self.wr_id.to_le_bytes());
        put(b, 8, self.byte_len.to_le_bytes());
        put(b, 12, self.imm.to_le_bytes());
        put(b, 16, self.qp_num.to_le_bytes());
        put(b, 20, self.src_qp.to_le_bytes());
        put(b, 24, [self.status, self.opcode, self.flags, 0, 0, 0, 0, 0]);
    }

    /// The entry in `b` (the library reads what roced wrote; any bytes decode).
    pub fn decode(b: &[u8; CQE_BYTES]) -> Cqe {
        Cqe {
            wr_id: u64_at(b, 0),
            byte_len: u32_at(b, 8),
            imm: u32_at(b, 12),
            qp_num: u32_at(b, 16),
            src_qp: u32_at(b, 20),
            status: b[24],
            opcode: b[25],
            flags: b[26],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn write(n_sge: usize) -> SendWqe<'static> {
        SendWqe {
            wr_id: 0x1122_3344_5566_7788,
            opcode: WrOpcode::WriteWithImm,
            flags: send_flags::SIGNALED | send_flags::FENCE,
            imm: 0xdead_beef,
            remote_addr: 0x7f00_0000_1000,
            rkey: 0x4242,
            compare_add: 0,
            swap: 0,
            ud: UdTarget::default(),
            sg: (0..n_sge as u64)
                .map(|i| Sge {
                    addr: 0x1000 * i,
                    length: 64,
                    lkey: 7,
                })
                .collect(),
            inline: &[],
        }
    }

    #[test]
    fn entries_round_trip_at_the_documented_offsets() {
        let w = write(2);
        let mut slot = [0u8; 128];
        assert_eq!(w.encode(&mut slot).unwrap(), 64 + 32);
        assert_eq!(slot[8], 1, "IBV_WR_RDMA_WRITE_WITH_IMM");
        assert_eq!(slot[9], 3);
        assert_eq!(slot[10], 2);
        assert_eq!(&slot[24..28], &0x4242u32.to_le_bytes());
        assert_eq!(&slot[64 + 16..64 + 24], &0x1000u64.to_le_bytes());
        assert_eq!(SendWqe::decode(&slot).unwrap(), w);
        let inline = SendWqe {
            flags: send_flags::INLINE,
            opcode: WrOpcode::Send,
            sg: ArrayVec::new(),
            inline: b"hello ferroce",
            ..write(0)
        };
        let n = inline.encode(&mut slot).unwrap();
        assert_eq!(SendWqe::decode(&slot[..n]).unwrap(), inline);
        let r = RecvWqe {
            wr_id: 9,
            sg: write(3).sg,
        };
        let n = r.encode(&mut slot).unwrap();
        assert_eq!(n, 16 + 48);
        assert_eq!(RecvWqe::decode(&slot).unwrap(), r);
        let c = Cqe {
            wr_id: 1,
            byte_len: 2,
            imm: 3,
            qp_num: 4,
            src_qp: 5,
            status: 6,
            opcode: 7,
            flags: 2,
        };
        assert_eq!(Cqe::decode(&c.encode()), c);
    }

    #[test]
    fn bad_entries_are_refused_field_by_field() {
        let mut slot = [0u8; 128];
        write(1).encode(&mut slot).unwrap();
        let mut s = slot;
        s[8] = 7; // IBV_WR_LOCAL_INV: not offered
        assert_eq!(SendWqe::decode(&s), Err(AbiError::Opcode(7)));
        let mut s = slot;
        s[9] = 0x10;
        assert_eq!(SendWqe::decode(&s), Err(AbiError::Flags(0x10)));
        let mut s = slot;
        s[10] = 9;
        assert_eq!(SendWqe::decode(&s), Err(AbiError::TooManySge(9)));
        // Four entries do not fit a 96-byte slot.
        let mut s = slot;
        s[10] = 4;
        assert_eq!(SendWqe::decode(&s[..96]), Err(AbiError::TooManySge(4)));
        let mut s = slot;
        s[9] = send_flags::INLINE;
        s[28..32].copy_from_slice(&100u32.to_le_bytes());
        assert_eq!(SendWqe::decode(&s), Err(AbiError::InlineTooLong(100)));
        assert_eq!(SendWqe::decode(&s[..10]), Err(AbiError::Short(10)));
        let mut long = write(0);
        long.flags |= send_flags::INLINE;
        long.inline = &[0u8; 513];
        assert_eq!(
            long.encode(&mut [0u8; 1024]),
            Err(AbiError::InlineTooLong(513))
        );
    }

    proptest! {
        /// Whatever an application writes into a slot decodes or is refused; nothing panics,
        /// and what decodes encodes back to the bytes it came from (but for padding).
        #[test]
        fn any_slot_decodes_or_is_refused(slot in proptest::collection::vec(any::<u8>(), 0..700)) {
            if let Ok(w) = SendWqe::decode(&slot) {
                let mut again = vec![0u8; w.encoded_len()];
                w.encode(&mut again).unwrap();
                prop_assert_eq!(SendWqe::decode(&again).unwrap(), w);
            }
            if let Ok(r) = RecvWqe::decode(&slot) {
                prop_assert!(r.sg.len() <= MAX_SGE);
            }
        }
    }
}
