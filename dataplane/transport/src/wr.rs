//! Work requests and how the requester cuts them into packets.
//!
//! [`plan`] is the pure part of the requester: from a work request's operation and length, the
//! path MTU and the first PSN, the packets it becomes (opcode, PSN, payload range, AckReq).
//! A message longer than the MTU goes as FIRST, MIDDLE..., LAST, each FIRST and MIDDLE exactly
//! one MTU; one that fits is ONLY. An RDMA READ request is one packet but takes one PSN per
//! response packet it asks for. AckReq is set on the last packet of a message and on every
//! [`ACK_EVERY`]-th packet of a long one (as rxe does), so a sender never runs far ahead of
//! acknowledgements. [`gather`] copies a packet's payload out of the SG list's regions.

use super::cq::WcOpcode;
use super::mr::{MrError, MrTable, PdHandle};
use super::qp::Mtu;
use arrayvec::ArrayVec;
use wire::opcode::op;
use wire::{Psn, atomic_eth, packet::ExtRepr, reth};

/// Scatter/gather entries per work request (the device limit; a QP's own limit may be lower).
pub const MAX_SGE: usize = 8;
/// Most bytes a work request may carry inline (the device limit).
pub const MAX_INLINE_DATA: u32 = 512;
/// A packet in every this many of a message asks for an ACK.
pub const ACK_EVERY: u32 = 64;

/// One scatter/gather entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address in a local region.
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// The region's local key.
    pub lkey: u32,
}

impl Sge {
    /// An SG list of the one entry `length` bytes at `addr` in the region `lkey`.
    pub fn list(addr: u64, length: u32, lkey: u32) -> SgList {
        let mut v = SgList::new();
        v.push(Sge { addr, length, lkey });
        v
    }
}

/// A work request's scatter/gather list: up to [`MAX_SGE`] entries, held inline. It is
/// `Copy`: requests are copied whole as they are posted (a stream posts the same one again and
/// again), and a flat copy of the list costs less than cloning it entry by entry. It reads as
/// a slice of its entries.
#[derive(Clone, Copy)]
pub struct SgList {
    len: u8,
    entries: [Sge; MAX_SGE],
}

impl SgList {
    const EMPTY: Sge = Sge {
        addr: 0,
        length: 0,
        lkey: 0,
    };

    /// An empty list.
    pub const fn new() -> Self {
        SgList {
            len: 0,
            entries: [Self::EMPTY; MAX_SGE],
        }
    }

    /// Appends `s`; an error (giving it back) when the list holds [`MAX_SGE`] already.
    pub fn try_push(&mut self, s: Sge) -> Result<(), Sge> {
        let i = self.len as usize;
        if i == MAX_SGE {
            return Err(s);
        }
        self.entries[i] = s;
        self.len += 1;
        Ok(())
    }

    /// Appends `s`.
    ///
    /// # Panics
    /// When the list is full (as `Vec::push` when out of memory; callers check the length
    /// first, or use [`Self::try_push`]).
    pub fn push(&mut self, s: Sge) {
        self.try_push(s)
            .expect("an SG list holds at most MAX_SGE entries");
    }

    /// Makes the list `f(0), f(1), ...` for each of `items` (the first [`MAX_SGE`] of them):
    /// no capacity check an entry.
    #[inline]
    pub fn set_from<T>(&mut self, items: &[T], mut f: impl FnMut(&T) -> Sge) {
        let items = &items[..items.len().min(MAX_SGE)];
        if let [t] = items {
            // The common list of one entry without a loop's setup.
            self.entries[0] = f(t);
        } else {
            for (e, t) in self.entries.iter_mut().zip(items) {
                *e = f(t);
            }
        }
        self.len = items.len() as u8;
    }

    /// Empties the list.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl Default for SgList {
    fn default() -> Self {
        Self::new()
    }
}

impl core::ops::Deref for SgList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        &self.entries[..self.len as usize]
    }
}

impl core::ops::DerefMut for SgList {
    fn deref_mut(&mut self) -> &mut [Sge] {
        &mut self.entries[..self.len as usize]
    }
}

impl PartialEq for SgList {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SgList {}

impl core::fmt::Debug for SgList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Collects up to [`MAX_SGE`] entries.
///
/// # Panics
/// On more (callers check the count first).
impl FromIterator<Sge> for SgList {
    fn from_iter<I: IntoIterator<Item = Sge>>(it: I) -> Self {
        let mut v = SgList::new();
        for s in it {
            v.push(s);
        }
        v
    }
}

impl<'a> IntoIterator for &'a SgList {
    type Item = &'a Sge;
    type IntoIter = core::slice::Iter<'a, Sge>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// What a send work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm(u32),
    /// SEND that invalidates a remote key.
    SendWithInv(u32),
    /// RDMA WRITE.
    Write {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate data.
    WriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into the SG list.
    Read {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Compare and swap 8 bytes; the original value lands in the SG list.
    CmpSwap {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// Fetch and add 8 bytes; the original value lands in the SG list.
    FetchAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
}

impl SendOp {
    /// The completion opcode.
    pub fn wc_opcode(self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CmpSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }

    /// True for READ and atomics (they count against max_rd_atomic).
    pub fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. }
        )
    }
}

/// A send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Where the data is (or, for READ and atomics, where the result goes).
    pub sg: SgList,
    /// Generate a completion on success.
    pub signaled: bool,
    /// Ask the remote to raise a solicited event.
    pub solicited: bool,
    /// Start only after every earlier READ and atomic on the QP has completed (IBV_SEND_FENCE),
    /// so this request cannot change memory one of them is still reading.
    pub fence: bool,
    /// Send the SG list's bytes inline (IBV_SEND_INLINE): they are copied when the request
    /// is posted, so its regions are free again at once (see [`take_inline`]).
    pub inline: bool,
    /// Where a UD QP's message goes (None on RC QPs, which have their peer).
    pub ud: Option<UdDest>,
}

/// The destination of a UD send: verbs' address handle (resolved to a path), the remote QPN
/// and the Q_Key the datagram carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// Where the remote end is.
    pub path: super::qp::Path,
    /// The remote QP.
    pub dest_qp: u32,
    /// The Q_Key (must match the remote QP's).
    pub qkey: u32,
}

impl SendWr {
    /// A signalled request with no fence and no solicited event (what most callers post).
    pub fn new(wr_id: u64, op: SendOp, sg: SgList) -> Self {
        SendWr {
            wr_id,
            op,
            sg,
            signaled: true,
            solicited: false,
            fence: false,
            inline: false,
            ud: None,
        }
    }

    /// Total bytes of the SG list.
    #[inline]
    pub fn length(&self) -> u64 {
        self.sg.iter().map(|s| s.length as u64).sum()
    }
}

/// A receive work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where received data goes.
    pub sg: SgList,
}

/// Why a work request cannot be posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WrError {
    /// Longer than a message may be (2^31 bytes).
    #[error("message too long")]
    TooLong,
    /// Atomics move exactly 8 bytes to an 8-byte-aligned address.
    #[error("atomics need an 8-byte SG list and an aligned remote address")]
    BadAtomic,
    /// More SG entries than the QP was created for.
    #[error("more scatter/gather entries than the QP's max_send_sge/max_recv_sge")]
    TooManySge,
    /// Inline data longer than the QP's max_inline_data, or inline on a READ or atomic.
    #[error("inline data longer than max_inline_data, or on an operation that carries none")]
    BadInline,
    /// An inline request's SG list names memory that no local key covers.
    #[error("an inline request's SG list is outside its regions (or a key is wrong)")]
    BadInlineSge,
    /// A UD QP's send names no destination, or an RC QP's names one.
    #[error(
        "a UD QP's send needs its destination (address, remote QPN, Q_Key); an RC QP's takes none"
    )]
    UdDest,
    /// UD carries SEND and SEND with immediate only.
    #[error("a UD QP sends only SEND and SEND with immediate")]
    UdOp,
    /// A UD message is one packet.
    #[error("a UD message must fit one packet (at most the port's MTU)")]
    UdTooLong,
}

/// One packet of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketPlan {
    /// BTH opcode.
    pub opcode: u8,
    /// PSN.
    pub psn: Psn,
    /// Offset of this packet's payload in the message.
    pub offset: u32,
    /// Payload bytes.
    pub len: u32,
    /// Ask for an ACK.
    pub ack_req: bool,
    /// First packet of the message.
    pub first: bool,
    /// Last packet of the message.
    pub last: bool,
}

/// The packets of one message, and the PSNs it uses; packets are computed on demand
/// ([`Plan::packet`]), so a 1 MiB message costs nothing to plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// PSNs the message consumes (READ: one per response packet).
    pub psns: u32,
    /// Packets in the message (for SEND/WRITE: the packets; READ and atomics: 1).
    pub count: u32,
    first_psn: Psn,
    len: u32,
    mtu: u32,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send { imm: bool, inv: bool },
    Write { imm: bool },
    Single(u8),
}

/// Plans a message of `len` bytes starting at `first_psn`. Inlined into the post path (left
/// to itself, LLVM inlines it or not as unrelated code in the crate changes: 35 instructions
/// a post either way in stream_cost).
#[inline(always)]
pub fn plan(opv: SendOp, len: u64, mtu: Mtu, first_psn: Psn) -> Result<Plan, WrError> {
    if len > 1 << 31 {
        return Err(WrError::TooLong);
    }
    let len = len as u32;
    let m = mtu.bytes();
    let segments = len.div_ceil(m).max(1);
    let (kind, count, psns) = match opv {
        SendOp::Send => (
            Kind::Send {
                imm: false,
                inv: false,
            },
            segments,
            segments,
        ),
        SendOp::SendWithImm(_) => (
            Kind::Send {
                imm: true,
                inv: false,
            },
            segments,
            segments,
        ),
        SendOp::SendWithInv(_) => (
            Kind::Send {
                imm: false,
                inv: true,
            },
            segments,
            segments,
        ),
        SendOp::Write { .. } => (Kind::Write { imm: false }, segments, segments),
        SendOp::WriteWithImm { .. } => (Kind::Write { imm: true }, segments, segments),
        SendOp::Read { .. } => (Kind::Single(op::RC_READ_REQUEST), 1, segments),
        SendOp::CmpSwap { remote_addr, .. } | SendOp::FetchAdd { remote_addr, .. } => {
            if len != 8 || !remote_addr.is_multiple_of(8) {
                return Err(WrError::BadAtomic);
            }
            let o = if matches!(opv, SendOp::CmpSwap { .. }) {
                op::RC_CMP_SWAP
            } else {
                op::RC_FETCH_ADD
            };
            (Kind::Single(o), 1, 1)
        }
    };
    Ok(Plan {
        psns,
        count,
        first_psn,
        len,
        mtu: m,
        kind,
    })
}

impl Plan {
    /// Packet `i` (0-based) of the message.
    #[inline]
    pub fn packet(&self, i: u32) -> PacketPlan {
        debug_assert!(i < self.count);
        let first = i == 0;
        let last = i + 1 == self.count;
        let psn = self.first_psn.add(i);
        let (opcode, offset, len) = match self.kind {
            // READ requests and atomics carry no payload.
            Kind::Single(o) => (o, 0, 0),
            Kind::Send { imm, inv } => {
                let o = match (first, last) {
                    (true, true) if imm => op::RC_SEND_ONLY_IMM,
                    (true, true) if inv => op::RC_SEND_ONLY_INV,
                    (true, true) => op::RC_SEND_ONLY,
                    (true, false) => op::RC_SEND_FIRST,
                    (false, false) => op::RC_SEND_MIDDLE,
                    (false, true) if imm => op::RC_SEND_LAST_IMM,
                    (false, true) if inv => op::RC_SEND_LAST_INV,
                    (false, true) => op::RC_SEND_LAST,
                };
                (o, i * self.mtu, self.seg_len(i))
            }
            Kind::Write { imm } => {
                let o = match (first, last) {
                    (true, true) if imm => op::RC_WRITE_ONLY_IMM,
                    (true, true) => op::RC_WRITE_ONLY,
                    (true, false) => op::RC_WRITE_FIRST,
                    (false, false) => op::RC_WRITE_MIDDLE,
                    (false, true) if imm => op::RC_WRITE_LAST_IMM,
                    (false, true) => op::RC_WRITE_LAST,
                };
                (o, i * self.mtu, self.seg_len(i))
            }
        };
        let ack_req = last || (i + 1).is_multiple_of(ACK_EVERY);
        PacketPlan {
            opcode,
            psn,
            offset,
            len,
            ack_req,
            first,
            last,
        }
    }

    fn seg_len(&self, i: u32) -> u32 {
        (self.len - i * self.mtu).min(self.mtu)
    }

    /// Every packet, in order.
    pub fn iter(&self) -> impl Iterator<Item = PacketPlan> + '_ {
        (0..self.count).map(|i| self.packet(i))
    }
}

/// The extension headers of a request packet.
pub fn ext_headers(opv: SendOp, p: &PacketPlan, total_len: u64) -> ExtRepr {
    let mut e = ExtRepr::default();
    match opv {
        SendOp::SendWithImm(imm) if p.last => e.immdt = Some(imm),
        SendOp::SendWithInv(k) if p.last => e.ieth = Some(k),
        SendOp::Write { remote_addr, rkey }
        | SendOp::WriteWithImm {
            remote_addr, rkey, ..
        } if p.first => {
            e.reth = Some(reth::Repr {
                va: remote_addr,
                rkey,
                dma_len: total_len as u32,
            });
        }
        SendOp::Read { remote_addr, rkey } => {
            e.reth = Some(reth::Repr {
                va: remote_addr,
                rkey,
                dma_len: total_len as u32,
            })
        }
        SendOp::CmpSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            e.atomic_eth = Some(atomic_eth::Repr {
                va: remote_addr,
                rkey,
                swap_add: swap,
                compare,
            })
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            e.atomic_eth = Some(atomic_eth::Repr {
                va: remote_addr,
                rkey,
                swap_add: add,
                compare: 0,
            })
        }
        _ => {}
    }
    if let SendOp::WriteWithImm { imm, .. } = opv
        && p.last
    {
        e.immdt = Some(imm);
    }
    e
}

/// The SG entry holding all of `len` bytes at `offset` of the message `sg` describes: its
/// local key and the bytes' address. `None` when they span entries or lie past the end.
pub fn locate(sg: &[Sge], mut offset: u64, len: u64) -> Option<(u32, u64)> {
    for s in sg {
        if offset < s.length as u64 {
            return (offset + len <= s.length as u64).then_some((s.lkey, s.addr + offset));
        }
        offset -= s.length as u64;
    }
    None
}

/// The bytes of a request posted inline.
pub type InlineData = ArrayVec<u8, { MAX_INLINE_DATA as usize }>;

/// An inline request's bytes (IBV_SEND_INLINE with an SG list): gathered from the regions
/// now and the SG list emptied, for `RcQp::post_send`. None for a request that is not
/// inline; an error when its bytes are more than [`MAX_INLINE_DATA`] or outside its regions.
pub fn take_inline(
    mrs: &MrTable,
    pd: PdHandle,
    wr: &mut SendWr,
) -> Result<Option<InlineData>, WrError> {
    let d = inline_bytes(mrs, pd, wr)?;
    if d.is_some() {
        wr.sg.clear();
    }
    Ok(d)
}

/// [`take_inline`] without emptying the SG list (for `RcQp::post_send`, which leaves
/// it out of the copy it posts).
pub fn inline_bytes(
    mrs: &MrTable,
    pd: PdHandle,
    wr: &SendWr,
) -> Result<Option<InlineData>, WrError> {
    if !wr.inline {
        return Ok(None);
    }
    let len = wr.length();
    if len > MAX_INLINE_DATA as u64 || wr.op.is_read_or_atomic() {
        return Err(WrError::BadInline);
    }
    let mut d = InlineData::new();
    d.extend(core::iter::repeat_n(0, len as usize));
    gather(mrs, pd, &wr.sg, 0, &mut d).map_err(|_| WrError::BadInlineSge)?;
    Ok(Some(d))
}

/// Copies `len` bytes at `offset` of the message described by `sg` into `out`, checking each
/// region's key and bounds (a failure is a local protection error).
#[inline]
pub fn gather(
    mrs: &MrTable,
    pd: PdHandle,
    sg: &[Sge],
    mut offset: u64,
    out: &mut [u8],
) -> Result<(), MrError> {
    let mut done = 0;
    for s in sg {
        if done == out.len() {
            break;
        }
        if offset >= s.length as u64 {
            offset -= s.length as u64;
            continue;
        }
        let take = ((s.length as u64 - offset) as usize).min(out.len() - done);
        let r = mrs.local(s.lkey, pd)?;
        r.read(s.addr + offset, &mut out[done..done + take])?;
        done += take;
        offset = 0;
    }
    if done == out.len() {
        Ok(())
    } else {
        Err(MrError::OutOfBounds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sg_lists_hold_up_to_max_sge_and_compare_by_their_entries() {
        let e = |i: u64| Sge {
            addr: i,
            length: i as u32,
            lkey: 1,
        };
        let mut a = SgList::new();
        for i in 0..MAX_SGE as u64 {
            a.try_push(e(i)).unwrap();
        }
        assert_eq!(a.try_push(e(99)), Err(e(99)));
        assert_eq!(a.len(), MAX_SGE);
        assert_eq!(a.iter().map(|s| s.addr).sum::<u64>(), 28);
        // Entries past the length do not count: a list cut short equals one built short.
        let b: SgList = (0..3).map(e).collect();
        let mut c = a;
        c.clear();
        assert!(c.is_empty());
        for i in 0..3 {
            c.push(e(i));
        }
        assert_eq!(b, c);
        assert_ne!(a, c);
        assert_eq!(format!("{b:?}").matches("Sge").count(), 3);
    }
    use crate::mr::Access;
    use wire::opcode::lookup;

    fn names(p: &Plan) -> Vec<(&'static str, u32, u32, bool)> {
        p.iter()
            .map(|k| (lookup(k.opcode).name, k.psn.value(), k.len, k.ack_req))
            .collect()
    }

    #[test]
    fn send_segments_by_mtu() {
        let p = plan(SendOp::Send, 2500, Mtu::M1024, Psn::new(10)).unwrap();
        assert_eq!(
            names(&p),
            vec![
                ("RC SEND First", 10, 1024, false),
                ("RC SEND Middle", 11, 1024, false),
                ("RC SEND Last", 12, 452, true)
            ]
        );
        let p = plan(SendOp::SendWithImm(7), 1024, Mtu::M1024, Psn::new(0)).unwrap();
        assert_eq!(
            names(&p),
            vec![("RC SEND Only with Immediate", 0, 1024, true)]
        );
        let p = plan(SendOp::Send, 0, Mtu::M256, Psn::new(0)).unwrap();
        assert_eq!(
            names(&p),
            vec![("RC SEND Only", 0, 0, true)],
            "zero-length messages are ONLY"
        );
        let p = plan(SendOp::SendWithInv(0x42), 300, Mtu::M256, Psn::new(0)).unwrap();
        assert_eq!(
            lookup(p.packet(1).opcode).name,
            "RC SEND Last with Invalidate"
        );
        assert_eq!(
            ext_headers(SendOp::SendWithInv(0x42), &p.packet(1), 300).ieth,
            Some(0x42)
        );
    }

    #[test]
    fn write_carries_reth_first_and_imm_last() {
        let opv = SendOp::WriteWithImm {
            remote_addr: 0x1000,
            rkey: 9,
            imm: 5,
        };
        let p = plan(opv, 4096 + 1, Mtu::M4096, Psn::new(0)).unwrap();
        let pk: Vec<_> = p.iter().collect();
        assert_eq!(lookup(pk[0].opcode).name, "RC RDMA WRITE First");
        assert_eq!(
            lookup(pk[1].opcode).name,
            "RC RDMA WRITE Last with Immediate"
        );
        let e0 = ext_headers(opv, &pk[0], 4097);
        assert_eq!(
            e0.reth,
            Some(reth::Repr {
                va: 0x1000,
                rkey: 9,
                dma_len: 4097
            })
        );
        assert_eq!(e0.immdt, None);
        let e1 = ext_headers(opv, &pk[1], 4097);
        assert_eq!((e1.reth, e1.immdt), (None, Some(5)));
    }

    #[test]
    fn read_takes_a_psn_per_response_packet() {
        let p = plan(
            SendOp::Read {
                remote_addr: 0,
                rkey: 1,
            },
            4096,
            Mtu::M1024,
            Psn::new(100),
        )
        .unwrap();
        assert_eq!((p.count, p.psns), (1, 4));
        assert_eq!(names(&p), vec![("RC RDMA READ Request", 100, 0, true)]);
        let p = plan(
            SendOp::Read {
                remote_addr: 0,
                rkey: 1,
            },
            0,
            Mtu::M1024,
            Psn::new(0),
        )
        .unwrap();
        assert_eq!(p.psns, 1, "a zero-length READ still takes one PSN");
    }

    #[test]
    fn atomics_are_single_packets_of_eight_aligned_bytes() {
        let cs = SendOp::CmpSwap {
            remote_addr: 0x10,
            rkey: 3,
            compare: 1,
            swap: 2,
        };
        let p = plan(cs, 8, Mtu::M256, Psn::new(0)).unwrap();
        assert_eq!(names(&p), vec![("RC CmpSwap", 0, 0, true)]);
        let e = ext_headers(cs, &p.packet(0), 8).atomic_eth.unwrap();
        assert_eq!((e.compare, e.swap_add), (1, 2));
        assert_eq!(plan(cs, 4, Mtu::M256, Psn::new(0)), Err(WrError::BadAtomic));
        let fa = SendOp::FetchAdd {
            remote_addr: 0x14,
            rkey: 3,
            add: 1,
        };
        assert_eq!(plan(fa, 8, Mtu::M256, Psn::new(0)), Err(WrError::BadAtomic));
    }

    #[test]
    fn psns_wrap_inside_a_message_and_long_messages_ask_for_acks() {
        let p = plan(
            SendOp::Write {
                remote_addr: 0,
                rkey: 1,
            },
            256 * 130,
            Mtu::M256,
            Psn::new(0xff_fffe),
        )
        .unwrap();
        let psns: Vec<u32> = p.iter().map(|k| k.psn.value()).take(4).collect();
        assert_eq!(psns, vec![0xff_fffe, 0xff_ffff, 0, 1]);
        let acks: Vec<u32> = p
            .iter()
            .enumerate()
            .filter(|(_, k)| k.ack_req)
            .map(|(i, _)| i as u32)
            .collect();
        assert_eq!(acks, vec![63, 127, 129]);
        assert_eq!(
            plan(SendOp::Send, (1 << 31) + 1, Mtu::M4096, Psn::new(0)),
            Err(WrError::TooLong)
        );
    }

    #[test]
    fn gather_walks_the_sg_list_and_checks_keys() {
        let mut t = MrTable::new();
        let pd = t.alloc_pd();
        let a = t
            .register(
                pd,
                0x1000,
                Box::new((0u8..100).collect::<Vec<u8>>()),
                Access::NONE,
            )
            .unwrap();
        let b = t
            .register(
                pd,
                0x9000,
                Box::new((100u8..200).collect::<Vec<u8>>()),
                Access::NONE,
            )
            .unwrap();
        let sg = [
            Sge {
                addr: 0x1000 + 90,
                length: 10,
                lkey: a,
            },
            Sge {
                addr: 0x9000,
                length: 50,
                lkey: b,
            },
        ];
        let mut out = [0u8; 20];
        gather(&t, pd, &sg, 5, &mut out).unwrap();
        let want: Vec<u8> = (95u8..100).chain(100..115).collect();
        assert_eq!(&out[..], &want[..]);
        let bad = [Sge {
            addr: 0x1000,
            length: 10,
            lkey: a ^ 0x2,
        }]; // same slot, wrong tag
        assert_eq!(
            gather(&t, pd, &bad, 0, &mut out[..4]),
            Err(MrError::InvalidKey)
        );
        let oob = [Sge {
            addr: 0x1000 + 95,
            length: 10,
            lkey: a,
        }];
        assert_eq!(
            gather(&t, pd, &oob, 0, &mut out[..10]),
            Err(MrError::OutOfBounds)
        );
        // A key of another protection domain is refused as an unknown one is: a QP of one
        // application cannot send or receive through another's memory.
        let other = t.alloc_pd();
        assert_eq!(
            gather(&t, other, &sg, 0, &mut out),
            Err(MrError::InvalidKey)
        );
        // Inline requests: the bytes are taken now and the SG list emptied; a request that is
        // not inline is left alone; too long, a READ, or a bad key is refused.
        let mut wr = SendWr::new(1, SendOp::Send, sg.iter().copied().collect());
        assert_eq!(take_inline(&t, pd, &mut wr), Ok(None));
        assert_eq!(wr.sg.len(), 2);
        wr.inline = true;
        let d = take_inline(&t, pd, &mut wr).unwrap().unwrap();
        let want: Vec<u8> = (90u8..100).chain(100..150).collect();
        assert_eq!((&d[..], wr.sg.len()), (&want[..], 0));
        let mut big = SendWr::new(2, SendOp::Send, Sge::list(0x9000, 600, b));
        big.inline = true;
        assert_eq!(take_inline(&t, pd, &mut big), Err(WrError::BadInline));
        let mut bad_key = SendWr::new(3, SendOp::Send, bad.iter().copied().collect());
        bad_key.inline = true;
        assert_eq!(
            take_inline(&t, pd, &mut bad_key),
            Err(WrError::BadInlineSge)
        );
        assert_eq!(bad_key.sg.len(), 1, "a refused request keeps its SG list");
    }
}
