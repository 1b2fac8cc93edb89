//! The responder's chain of checks, in rxe's order (`rxe_resp.c`): PSN, opcode sequence, opcode
//! valid for the QP, resources (a receive WQE, READ/atomic slots), length, then key, bounds and
//! rights. Each failure has its answer: a NAK code, an RNR NAK, or (for duplicates) the
//! duplicate handling. A pure function over the QP's responder state, so each check is tested
//! alone; execution comes after it.

use super::mr::{Access, MrError, MrTable, PdHandle};
use super::qp::Mtu;
use wire::aeth::NakCode;
use wire::opcode::{OpInfo, lookup, mask};
use wire::{Psn, atomic_eth, reth};

/// What the checks need of a request packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// BTH opcode.
    pub opcode: u8,
    /// PSN.
    pub psn: Psn,
    /// Payload bytes (without pad).
    pub payload_len: u32,
    /// RETH, for WRITE FIRST/ONLY and READ.
    pub reth: Option<reth::Repr>,
    /// AtomicETH, for atomics.
    pub atomic: Option<atomic_eth::Repr>,
}

/// The multi-packet message in progress, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum InMessage {
    /// Between messages.
    #[default]
    None,
    /// After a SEND FIRST or MIDDLE.
    Send,
    /// After a WRITE FIRST or MIDDLE.
    Write,
}

/// The responder's view of its QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponderState {
    /// Next expected PSN.
    pub expected: Psn,
    /// A PSN sequence NAK was sent for the current gap (send one per gap).
    pub nak_sent: bool,
    /// Message in progress.
    pub in_message: InMessage,
    /// Remote access the QP allows.
    pub access: Access,
    /// The QP's protection domain.
    pub pd: PdHandle,
    /// Path MTU.
    pub mtu: Mtu,
    /// READs and atomics accepted and not yet answered.
    pub rd_atomic_outstanding: u8,
    /// The QP's max_dest_rd_atomic.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code to send.
    pub min_rnr_timer: u8,
    /// A receive WQE is posted.
    pub recv_available: bool,
    /// Bytes the WRITE in progress still owes its RETH's DMA length (after its FIRST and any
    /// MIDDLEs): each MIDDLE must leave some for the LAST, which must bring exactly the rest.
    pub write_left: u32,
}

/// The outcome of the checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// All checks passed; for WRITE/READ/atomics, the offset in the target region.
    Execute {
        /// Offset of the remote address in its region (0 for SEND).
        mr_offset: usize,
    },
    /// An earlier PSN: handle as a duplicate (re-ACK, re-execute a READ, replay an atomic).
    Duplicate,
    /// A later PSN and this gap was already NAKed: drop silently.
    Drop,
    /// Answer with this NAK (the PSN sequence NAK carries the expected PSN).
    Nak(NakCode),
    /// Answer with an RNR NAK with this timer code; the requester retries.
    RnrNak(u8),
}

/// Runs the checks on `req`.
#[inline]
pub fn check(s: &ResponderState, req: &Request, mrs: &MrTable) -> Verdict {
    let op: &OpInfo = lookup(req.opcode);
    // CHK_PSN
    let d = req.psn.diff(s.expected);
    if d > 0 {
        return if s.nak_sent {
            Verdict::Drop
        } else {
            Verdict::Nak(NakCode::PsnSequenceError)
        };
    }
    if d < 0 {
        return Verdict::Duplicate;
    }
    // CHK_OP_SEQ: MIDDLE/LAST must continue the message in progress; nothing else may.
    let cont = op.has(mask::MIDDLE) || (op.has(mask::LAST) && !op.has(mask::FIRST));
    let ok_seq = match s.in_message {
        InMessage::None => !cont,
        InMessage::Send => cont && op.has(mask::SEND),
        InMessage::Write => cont && op.has(mask::WRITE),
    };
    if !ok_seq {
        return Verdict::Nak(NakCode::InvalidRequest);
    }
    // CHK_OP_VALID: an RC request the QP's access flags allow.
    if !op.is_valid() || !op.has(mask::RC) || !op.has(mask::REQ) {
        return Verdict::Nak(NakCode::InvalidRequest);
    }
    let need = if op.has(mask::WRITE) {
        Some(Access::REMOTE_WRITE)
    } else if op.has(mask::READ) {
        Some(Access::REMOTE_READ)
    } else if op.has(mask::ATOMIC) {
        Some(Access::REMOTE_ATOMIC)
    } else {
        None
    };
    if let Some(n) = need
        && !s.access.contains(n)
    {
        return Verdict::Nak(NakCode::InvalidRequest);
    }
    // CHK_RESOURCE
    if op.has(mask::RWR) && !s.recv_available {
        return Verdict::RnrNak(s.min_rnr_timer);
    }
    if (op.has(mask::READ) || op.has(mask::ATOMIC))
        && s.rd_atomic_outstanding >= s.max_dest_rd_atomic
    {
        return Verdict::Nak(NakCode::InvalidRequest);
    }
    // CHK_LENGTH: FIRST and MIDDLE carry exactly one MTU; LAST and ONLY at most one.
    let mtu = s.mtu.bytes();
    let len_ok = if op.has(mask::PAYLOAD) {
        if op.has(mask::FIRST) && !op.has(mask::LAST) || op.has(mask::MIDDLE) {
            req.payload_len == mtu
        } else {
            req.payload_len <= mtu
        }
    } else {
        req.payload_len == 0
    };
    if !len_ok {
        return Verdict::Nak(NakCode::InvalidRequest);
    }
    // A WRITE is held to its RETH's DMA length: ONLY carries all of it, FIRST one MTU of a
    // longer message, each MIDDLE one MTU short of the end, and LAST exactly what is left
    // (rxe's resid). A message longer or shorter than it said is an invalid request.
    if op.has(mask::WRITE) {
        let ok = match (req.reth, op.has(mask::FIRST), op.has(mask::LAST)) {
            (Some(r), true, true) => req.payload_len == r.dma_len,
            (Some(r), true, false) => r.dma_len > req.payload_len,
            (None, false, false) => s.write_left > req.payload_len,
            (None, false, true) => s.write_left == req.payload_len,
            _ => false,
        };
        if !ok {
            return Verdict::Nak(NakCode::InvalidRequest);
        }
    }
    // CHK_RKEY
    let target = match (need, req.reth, req.atomic) {
        (Some(Access::REMOTE_ATOMIC), _, Some(a)) => {
            Some((a.rkey, a.va, 8u64, Access::REMOTE_ATOMIC))
        }
        (Some(n), Some(r), _) => Some((r.rkey, r.va, r.dma_len as u64, n)),
        (Some(_), None, None) if op.has(mask::WRITE) => None, // WRITE MIDDLE/LAST: checked at FIRST
        (Some(_), _, _) => return Verdict::Nak(NakCode::InvalidRequest),
        (None, _, _) => None,
    };
    match target {
        Some((rkey, va, len, n)) => match mrs.check_remote(s.pd, rkey, va, len, n) {
            Ok(off) => Verdict::Execute { mr_offset: off },
            Err(MrError::Misaligned) if n == Access::REMOTE_ATOMIC => {
                Verdict::Nak(NakCode::InvalidRequest)
            }
            Err(_) => Verdict::Nak(NakCode::RemoteAccessError),
        },
        None => Verdict::Execute { mr_offset: 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::opcode::op;

    struct Env {
        mrs: MrTable,
        pd: PdHandle,
        key: u32,
        atomic_key: u32,
    }

    fn env() -> Env {
        let mut mrs = MrTable::new();
        let pd = mrs.alloc_pd();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let key = mrs
            .register(pd, 0x10000, Box::new(vec![0u8; 8192]), rw)
            .unwrap();
        let atomic_key = mrs
            .register(
                pd,
                0x40000,
                Box::new(vec![0u8; 64]),
                Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
            )
            .unwrap();
        Env {
            mrs,
            pd,
            key,
            atomic_key,
        }
    }

    fn state(e: &Env) -> ResponderState {
        ResponderState {
            expected: Psn::new(100),
            nak_sent: false,
            in_message: InMessage::None,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            pd: e.pd,
            mtu: Mtu::M1024,
            rd_atomic_outstanding: 0,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            recv_available: true,
            write_left: 0,
        }
    }

    fn req(opcode: u8, psn: u32, len: u32) -> Request {
        Request {
            opcode,
            psn: Psn::new(psn),
            payload_len: len,
            reth: None,
            atomic: None,
        }
    }

    fn write(e: &Env, opcode: u8, va: u64, len: u32, dma: u32) -> Request {
        Request {
            reth: Some(reth::Repr {
                va,
                rkey: e.key,
                dma_len: dma,
            }),
            ..req(opcode, 100, len)
        }
    }

    #[test]
    fn psn_check_naks_a_gap_once_and_flags_duplicates() {
        let e = env();
        let mut s = state(&e);
        assert_eq!(
            check(&s, &req(op::RC_SEND_ONLY, 100, 8), &e.mrs),
            Verdict::Execute { mr_offset: 0 }
        );
        assert_eq!(
            check(&s, &req(op::RC_SEND_ONLY, 105, 8), &e.mrs),
            Verdict::Nak(NakCode::PsnSequenceError)
        );
        s.nak_sent = true;
        assert_eq!(
            check(&s, &req(op::RC_SEND_ONLY, 106, 8), &e.mrs),
            Verdict::Drop,
            "one NAK per gap"
        );
        assert_eq!(
            check(&s, &req(op::RC_SEND_ONLY, 99, 8), &e.mrs),
            Verdict::Duplicate
        );
        s.expected = Psn::new(1);
        assert_eq!(
            check(&s, &req(op::RC_SEND_ONLY, 0xff_ffff, 8), &e.mrs),
            Verdict::Duplicate,
            "across the wrap"
        );
    }

    #[test]
    fn opcode_sequence_is_checked() {
        let e = env();
        let mut s = state(&e);
        assert_eq!(
            check(&s, &req(op::RC_SEND_MIDDLE, 100, 1024), &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            check(&s, &req(op::RC_SEND_LAST, 100, 10), &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
        s.in_message = InMessage::Send;
        assert_eq!(
            check(&s, &req(op::RC_SEND_MIDDLE, 100, 1024), &e.mrs),
            Verdict::Execute { mr_offset: 0 }
        );
        assert_eq!(
            check(&s, &req(op::RC_SEND_ONLY, 100, 10), &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            check(&s, &req(op::RC_WRITE_LAST, 100, 10), &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
    }

    #[test]
    fn opcodes_must_be_rc_requests_the_qp_allows() {
        let e = env();
        let mut s = state(&e);
        assert_eq!(
            check(&s, &req(op::RC_ACK, 100, 0), &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            check(&s, &req(op::UD_SEND_ONLY, 100, 8), &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            check(&s, &req(0x15, 100, 0), &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
        s.access = Access::REMOTE_READ;
        let w = write(&e, op::RC_WRITE_ONLY, 0x10000, 8, 8);
        assert_eq!(
            check(&s, &w, &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest),
            "QP without remote write"
        );
    }

    #[test]
    fn resources_rnr_and_rd_atomic_limit() {
        let e = env();
        let mut s = state(&e);
        s.recv_available = false;
        assert_eq!(
            check(&s, &req(op::RC_SEND_ONLY, 100, 8), &e.mrs),
            Verdict::RnrNak(12)
        );
        let wi = write(&e, op::RC_WRITE_ONLY_IMM, 0x10000, 8, 8);
        assert_eq!(
            check(&s, &wi, &e.mrs),
            Verdict::RnrNak(12),
            "WRITE with immediate consumes a WQE"
        );
        let w = write(&e, op::RC_WRITE_ONLY, 0x10000, 8, 8);
        assert_eq!(
            check(&s, &w, &e.mrs),
            Verdict::Execute { mr_offset: 0 },
            "plain WRITE needs none"
        );
        s.rd_atomic_outstanding = 4;
        let r = write(&e, op::RC_READ_REQUEST, 0x10000, 0, 4096);
        assert_eq!(check(&s, &r, &e.mrs), Verdict::Nak(NakCode::InvalidRequest));
    }

    #[test]
    fn lengths_follow_the_mtu_and_the_reth() {
        let e = env();
        let mut s = state(&e);
        assert_eq!(
            check(&s, &req(op::RC_SEND_FIRST, 100, 1000), &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            check(&s, &req(op::RC_SEND_ONLY, 100, 1025), &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
        let w = write(&e, op::RC_WRITE_ONLY, 0x10000, 100, 50);
        assert_eq!(
            check(&s, &w, &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest),
            "payload beyond the DMA length"
        );
        let r = Request {
            payload_len: 4,
            ..write(&e, op::RC_READ_REQUEST, 0x10000, 0, 64)
        };
        assert_eq!(
            check(&s, &r, &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest),
            "READ request with payload"
        );
        s.in_message = InMessage::Write;
        assert_eq!(
            check(&s, &req(op::RC_WRITE_MIDDLE, 100, 512), &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
    }

    #[test]
    fn keys_bounds_and_rights_give_remote_access_errors() {
        let e = env();
        let s = state(&e);
        let ok = write(&e, op::RC_WRITE_ONLY, 0x10000 + 8, 1024, 1024);
        assert_eq!(check(&s, &ok, &e.mrs), Verdict::Execute { mr_offset: 8 });
        let oob = write(&e, op::RC_WRITE_ONLY, 0x10000 + 8192 - 4, 8, 8);
        assert_eq!(
            check(&s, &oob, &e.mrs),
            Verdict::Nak(NakCode::RemoteAccessError)
        );
        let mut badkey = write(&e, op::RC_WRITE_ONLY, 0x10000, 8, 8);
        badkey.reth.as_mut().unwrap().rkey ^= 0x2;
        assert_eq!(
            check(&s, &badkey, &e.mrs),
            Verdict::Nak(NakCode::RemoteAccessError)
        );
        // The region grants no atomics; the atomic region no reads.
        let a = Request {
            atomic: Some(atomic_eth::Repr {
                va: 0x10000,
                rkey: e.key,
                swap_add: 1,
                compare: 0,
            }),
            ..req(op::RC_FETCH_ADD, 100, 0)
        };
        assert_eq!(
            check(&s, &a, &e.mrs),
            Verdict::Nak(NakCode::RemoteAccessError)
        );
        let r = Request {
            reth: Some(reth::Repr {
                va: 0x40000,
                rkey: e.atomic_key,
                dma_len: 8,
            }),
            ..req(op::RC_READ_REQUEST, 100, 0)
        };
        assert_eq!(
            check(&s, &r, &e.mrs),
            Verdict::Nak(NakCode::RemoteAccessError)
        );
        let good = Request {
            atomic: Some(atomic_eth::Repr {
                va: 0x40008,
                rkey: e.atomic_key,
                swap_add: 1,
                compare: 0,
            }),
            ..req(op::RC_FETCH_ADD, 100, 0)
        };
        assert_eq!(check(&s, &good, &e.mrs), Verdict::Execute { mr_offset: 8 });
        let misaligned = Request {
            atomic: Some(atomic_eth::Repr {
                va: 0x40004,
                rkey: e.atomic_key,
                swap_add: 1,
                compare: 0,
            }),
            ..req(op::RC_CMP_SWAP, 100, 0)
        };
        assert_eq!(
            check(&s, &misaligned, &e.mrs),
            Verdict::Nak(NakCode::InvalidRequest)
        );
    }
}
