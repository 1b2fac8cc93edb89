//! Completion queues and work completions.
//!
//! A CQ is bounded. When a completion arrives at a full CQ, the CQ goes to the error state, as
//! hardware does: the completion is lost, the owner gets an asynchronous error, and the QPs that
//! use it must be moved to the error state by whoever handles that event.

use std::collections::VecDeque;

/// Completion status (ibv_wc_status, with its values: an application's completion ring
/// carries them as they are).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcStatus {
    /// Done.
    Success = 0,
    /// A receive buffer was too small, or a message too long for the QP.
    LocLenErr = 1,
    /// Local QP operation error.
    LocQpOpErr = 2,
    /// Local protection error (bad lkey, bounds, access).
    LocProtErr = 4,
    /// Flushed: the QP went to the error state before this work request completed.
    WrFlushErr = 5,
    /// The responder refused the remote access (NAK remote access error).
    RemAccessErr = 10,
    /// The responder found the request invalid (NAK invalid request).
    RemInvReqErr = 9,
    /// The responder failed to execute it (NAK remote operational error).
    RemOpErr = 11,
    /// No ACK after retry_cnt retransmissions.
    RetryExcErr = 12,
    /// RNR NAKs beyond rnr_retry.
    RnrRetryExcErr = 13,
    /// A bad response (unexpected opcode or length).
    BadRespErr = 7,
    /// General error.
    GeneralErr = 21,
}

/// What a completion completes (ibv_wc_opcode, with its values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcOpcode {
    /// SEND (with or without immediate or invalidate).
    Send = 0,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite = 1,
    /// RDMA READ.
    RdmaRead = 2,
    /// Compare and swap.
    CompSwap = 3,
    /// Fetch and add.
    FetchAdd = 4,
    /// A receive.
    Recv = 128,
    /// A receive consumed by RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// The send-side opcodes, in the order of [`LatencyHistograms::by_opcode`].
    pub const SEND_SIDE: [WcOpcode; 5] = [
        WcOpcode::Send,
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
    ];

    /// The name `ibv_wc_opcode_str` gives it, lower case.
    pub fn name(self) -> &'static str {
        match self {
            WcOpcode::Send => "send",
            WcOpcode::RdmaWrite => "rdma_write",
            WcOpcode::RdmaRead => "rdma_read",
            WcOpcode::CompSwap => "comp_swap",
            WcOpcode::FetchAdd => "fetch_add",
            WcOpcode::Recv => "recv",
            WcOpcode::RecvRdmaWithImm => "recv_rdma_with_imm",
        }
    }
}

/// Completion latency, post to completion, of one lcore's send work requests: one histogram
/// per send-side opcode ([`WcOpcode::SEND_SIDE`]), in nanoseconds, two significant digits from
/// 100 ns to 100 s. Created once (a few tens of KiB); recording never allocates.
#[derive(Clone, Debug)]
pub struct LatencyHistograms {
    /// Per opcode, in [`WcOpcode::SEND_SIDE`] order.
    pub by_opcode: Vec<hdrhistogram::Histogram<u64>>,
}

impl Default for LatencyHistograms {
    fn default() -> Self {
        let h = hdrhistogram::Histogram::new_with_bounds(100, 100_000_000_000, 2)
            .expect("valid histogram bounds");
        LatencyHistograms {
            by_opcode: vec![h; WcOpcode::SEND_SIDE.len()],
        }
    }
}

impl LatencyHistograms {
    /// Records `ns` for a completed `op` (values outside the bounds are clamped).
    pub fn record(&mut self, op: WcOpcode, ns: u64) {
        if let Some(i) = WcOpcode::SEND_SIDE.iter().position(|o| *o == op) {
            self.by_opcode[i].saturating_record(ns.max(100));
        }
    }

    /// Adds `o`'s counts into these.
    pub fn add(&mut self, o: &LatencyHistograms) {
        for (a, b) in self.by_opcode.iter_mut().zip(&o.by_opcode) {
            let _ = a.add(b);
        }
    }
}

/// One completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: bytes received).
    pub byte_len: u32,
    /// Immediate data, for receives of "with immediate" messages.
    pub imm_data: Option<u32>,
    /// Invalidated rkey, for receives of "with invalidate" messages.
    pub invalidated_rkey: Option<u32>,
    /// The local QP.
    pub qp_num: u32,
    /// The sending QP, for receives on a UD QP (whose buffers start with the 40-byte GRH).
    pub src_qp: Option<u32>,
}

/// A bounded completion queue.
#[derive(Debug)]
pub struct CompletionQueue {
    cap: usize,
    entries: VecDeque<WorkCompletion>,
    error: bool,
    overflows: u64,
}

/// Pushing to a CQ in error, or overflowing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CqError {
    /// The CQ is full: it is now in error and the completion is lost.
    #[error("completion queue overflow")]
    Overflow,
    /// The CQ was already in error.
    #[error("completion queue in error")]
    InError,
}

impl CompletionQueue {
    /// A CQ for `cap` completions (at least 1).
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        CompletionQueue {
            cap,
            entries: VecDeque::with_capacity(cap),
            error: false,
            overflows: 0,
        }
    }

    /// Capacity.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when none are waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True once it overflowed.
    pub fn in_error(&self) -> bool {
        self.error
    }

    /// Times it overflowed.
    pub fn overflows(&self) -> u64 {
        self.overflows
    }

    /// Adds a completion.
    pub fn push(&mut self, wc: WorkCompletion) -> Result<(), CqError> {
        if self.error {
            return Err(CqError::InError);
        }
        if self.entries.len() >= self.cap {
            self.error = true;
            self.overflows += 1;
            return Err(CqError::Overflow);
        }
        self.entries.push_back(wc);
        Ok(())
    }

    /// The oldest completion, left in the queue.
    pub fn peek(&self) -> Option<&WorkCompletion> {
        self.entries.front()
    }

    /// Hands completions, oldest first, to `f` while it takes them (returns true), and drops
    /// those it took: how many. One pass over the queue's storage, then one cut.
    pub fn take_while(&mut self, mut f: impl FnMut(&WorkCompletion) -> bool) -> usize {
        let (a, b) = self.entries.as_slices();
        let mut n = 0;
        for wc in a.iter().chain(b) {
            if !f(wc) {
                break;
            }
            n += 1;
        }
        self.entries.drain(..n);
        n
    }

    /// Takes the oldest completion.
    pub fn pop(&mut self) -> Option<WorkCompletion> {
        self.entries.pop_front()
    }

    /// Moves up to `max` completions, oldest first, to `out` (ibv_poll_cq); returns how many.
    pub fn poll(&mut self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let n = max.min(self.entries.len());
        out.extend(self.entries.drain(..n));
        n
    }

    /// Takes every completion, oldest first, handing each to `f` (for a reader that only
    /// looks at them: nothing is copied out); returns how many.
    pub fn drain_each(&mut self, mut f: impl FnMut(&WorkCompletion)) -> usize {
        let n = self.entries.len();
        for c in self.entries.drain(..) {
            f(&c);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num: 1,
            src_qp: None,
        }
    }

    #[test]
    fn overflow_puts_the_cq_in_error() {
        let mut cq = CompletionQueue::new(2);
        cq.push(wc(1)).unwrap();
        cq.push(wc(2)).unwrap();
        assert_eq!(cq.push(wc(3)), Err(CqError::Overflow));
        assert!(cq.in_error());
        let mut out = Vec::new();
        assert_eq!(
            cq.poll(8, &mut out),
            2,
            "what was queued before the overflow is still there"
        );
        assert_eq!(out.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(cq.push(wc(4)), Err(CqError::InError), "stays in error");
        assert_eq!(cq.overflows(), 1);
    }

    #[test]
    fn drain_each_hands_over_every_completion_in_order() {
        let mut cq = CompletionQueue::new(8);
        for id in [5, 6, 7] {
            cq.push(wc(id)).unwrap();
        }
        let mut seen = Vec::new();
        assert_eq!(cq.drain_each(|c| seen.push(c.wr_id)), 3);
        assert_eq!(seen, vec![5, 6, 7]);
        assert_eq!(cq.drain_each(|_| panic!("empty")), 0);
        assert!(cq.pop().is_none());
    }
}
