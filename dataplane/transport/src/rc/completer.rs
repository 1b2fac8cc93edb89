//! The completer: ACKs, NAKs, READ responses and atomic ACKs matched to the send queue,
//! completions in order, the retry and RNR counts, the ACK timer.

use super::*;

/// The completer's state (rxe's `comp` info): where acknowledgement stands, the READ
/// responses placed ahead of it, the retry and RNR budgets and the two timers. The send
/// queue it retires is the QP's own (posting appends to it, the requester reads it).
#[derive(Debug)]
pub(super) struct Completer {
    /// Oldest PSN not yet acknowledged.
    pub(super) una: Psn,
    /// READ responses placed past `una` (for the READ at the front).
    read_win: ReadWindow,
    /// Retries left after timeouts and sequence NAKs (retry_cnt when something is acked).
    pub(super) retries_left: u8,
    /// RNR retries left (rnr_retry when something is acked; 7 = forever).
    pub(super) rnr_left: u8,
    /// A go-back-N is under way and nothing has been acknowledged since: acknowledgements
    /// still in flight from before it must not start another (rxe's `started_retry`).
    pub(super) retrying: bool,
    /// When the local ACK timeout fires, while the QP is owed an answer.
    pub(super) ack_deadline: Option<Instant>,
    /// The end of the RNR wait an RNR NAK named.
    pub(super) rnr_until: Option<Instant>,
    /// Completion latencies (opcode, ns) not yet taken by the host: room for a send queue's
    /// worth, allocated with the QP and never grown (the host takes them after every frame,
    /// and one frame completes at most the whole send queue). On the heap, not in the QP's
    /// slot: 4 KiB of a slot that was 5.5 KiB, which among a million QPs cost TLB reach.
    pub(super) latencies: Vec<(WcOpcode, u64)>,
}

impl Completer {
    pub(super) fn new(caps: QpCaps) -> Self {
        Completer {
            una: Psn::new(0),
            read_win: ReadWindow::default(),
            retries_left: 0,
            rnr_left: 0,
            retrying: false,
            ack_deadline: None,
            rnr_until: None,
            latencies: Vec::with_capacity(caps.max_send_wr as usize),
        }
    }

    /// The QP went to ERR: both timers stop and placed READ responses are forgotten.
    pub(super) fn stop(&mut self) {
        self.ack_deadline = None;
        self.rnr_until = None;
        self.read_win.clear();
    }
}

/// Which READ response PSNs at or after `una` have been placed in the local buffer: a ring of
/// [`READ_WINDOW`] bits indexed by PSN. Responses that arrive after a lost one are kept, so a
/// READ asked again only needs its holes filled (out-of-order placement, as RNICs built for
/// adaptive routing do); without it every lost response costs the whole rest of the READ.
#[derive(Clone, Copy, Debug, Default)]
struct ReadWindow([u64; (READ_WINDOW / 64) as usize]);

impl ReadWindow {
    fn bit(psn: Psn) -> (usize, u64) {
        let i = psn.value() % READ_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }
    fn has(&self, psn: Psn) -> bool {
        let (w, b) = Self::bit(psn);
        self.0[w] & b != 0
    }
    fn set(&mut self, psn: Psn) {
        let (w, b) = Self::bit(psn);
        self.0[w] |= b;
    }
    /// From `una`, clears the placed run and returns the new oldest missing PSN.
    fn advance(&mut self, mut una: Psn) -> Psn {
        while self.has(una) {
            let (w, b) = Self::bit(una);
            self.0[w] &= !b;
            una = una.add(1);
        }
        una
    }
    fn clear(&mut self) {
        self.0 = [0; (READ_WINDOW / 64) as usize];
    }
}

impl RcQp {
    /// Something was acknowledged: retries start over and the ACK timer restarts.
    pub(super) fn progress(&mut self) {
        self.comp.retrying = false;
        self.comp.retries_left = self.cfg.retry_cnt;
        self.comp.rnr_left = self.cfg.rnr_retry;
        self.comp.ack_deadline = None;
        self.arm_ack_timer();
    }

    /// Whether the QP is owed an answer: requests in flight, or (in RTS) requests waiting to
    /// be sent. While it is, the ACK timer runs.
    pub(super) fn owes_progress(&self) -> bool {
        self.cfg.qp_type == QpType::Rc
            && !self.sq.is_empty()
            && match self.cfg.state {
                QpState::Rts => true,
                // A draining QP starts nothing new: only what is in flight is owed.
                QpState::Sqd => self.req.sent_hw.diff(self.comp.una) > 0,
                _ => false,
            }
    }

    /// Starts the ACK timer if it is not running and the QP is owed an answer (and is not
    /// waiting out an RNR NAK). It runs whatever the port does: a QP whose frames cannot
    /// leave (its link down, its peer gone) still times out, retries and fails with
    /// RETRY_EXC_ERR after retry_cnt tries, as an RNIC's does.
    pub(super) fn arm_ack_timer(&mut self) {
        if self.comp.ack_deadline.is_none() && self.comp.rnr_until.is_none() && self.owes_progress()
        {
            self.comp.ack_deadline = self.cfg.ack_timeout().map(|t| self.now + t);
        }
    }

    /// Completes the SEND/WRITE requests that were sent whole and end at or before `psn`.
    pub(super) fn ack_upto(&mut self, psn: Psn, cq: &mut CompletionQueue) -> usize {
        let mut n = 0;
        for (k, w) in self.sq.iter().enumerate() {
            let sent_whole = w.last_psn().diff(self.req.sent_hw) < 0;
            if !sent_whole || w.last_psn().diff(psn) > 0 || w.wr.op.is_read_or_atomic() {
                break;
            }
            n = k + 1;
        }
        self.complete_upto(n, cq);
        // The oldest unacknowledged PSN moves past `psn`, but never past a READ or atomic
        // still waiting for its response (an ACK does not answer those).
        let mut una = psn.add(1);
        debug_assert_eq!(
            self.sq_rd_atomic,
            self.sq
                .iter()
                .filter(|w| w.wr.op.is_read_or_atomic())
                .count()
        );
        if self.sq_rd_atomic > 0
            && let Some(w) = self.sq.iter().find(|w| w.wr.op.is_read_or_atomic())
            && una.diff(w.first_psn) > 0
        {
            una = w.first_psn;
        }
        if una.diff(self.comp.una) > 0 {
            self.comp.una = una;
        }
        n
    }

    pub(super) fn complete(
        &mut self,
        info: &PacketInfo,
        frame: &[u8],
        mrs: &mut MrTable,
        cq: &mut CompletionQueue,
        rcq: &mut CompletionQueue,
    ) {
        let psn = info.psn;
        // An acknowledgement for a PSN never sent (or long acknowledged) is ignored.
        if psn.diff(self.req.sent_hw) >= 0 || psn.diff(self.comp.una) < -(1 << 22) {
            return;
        }
        // Implied NAK: responses come back in order, so an acknowledgement of any kind for a
        // PSN past an unanswered READ or atomic at the front means its responses were lost.
        // Go back to the oldest unacknowledged PSN (inside that request).
        if let Some(front) = self.sq.front()
            && front.wr.op.is_read_or_atomic()
            && psn.diff(front.last_psn()) > 0
        {
            if !self.comp.retrying {
                self.counters.implied_nak_seq_err += 1;
                self.retry(self.comp.una, cq, rcq);
            }
            return;
        }
        let syndrome = info.ext.aeth().map(|a| a.syndrome);
        match syndrome {
            Some(Syndrome::Nak(NakCode::PsnSequenceError)) => {
                self.counters.packet_seq_err += 1;
                // Everything before `psn` arrived (implied ACK); go back to `psn`. If that moved
                // the oldest unacknowledged PSN, it is progress and the retry count starts over.
                let before = self.comp.una;
                if self.ack_upto(psn.sub(1), cq) > 0 || self.comp.una.diff(before) > 0 {
                    self.progress();
                }
                // A NAK for a retry already under way (a duplicate, or one that crossed our
                // resend) starts nothing new.
                if !self.comp.retrying {
                    self.retry(psn, cq, rcq);
                }
                return;
            }
            Some(Syndrome::Nak(code)) => {
                self.ack_upto(psn.sub(1), cq);
                let status = match code {
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                    _ => WcStatus::RemInvReqErr,
                };
                self.fail_front(0, status, cq, rcq);
                return;
            }
            Some(Syndrome::RnrNak { timer }) => {
                self.counters.rnr_nak_retry_err += 1;
                self.ack_upto(psn.sub(1), cq);
                if self.cfg.rnr_retry != 7 {
                    if self.comp.rnr_left == 0 {
                        self.fail_front(0, WcStatus::RnrRetryExcErr, cq, rcq);
                        return;
                    }
                    self.comp.rnr_left -= 1;
                }
                self.rewind(psn);
                self.comp.rnr_until = Some(self.now + aeth::rnr_duration(timer));
                return;
            }
            _ => {}
        }
        // READ responses and atomic ACKs carry data for the request they answer.
        if let Some(i) = self
            .sq
            .iter()
            .position(|w| psn.diff(w.first_psn) >= 0 && psn.diff(w.last_psn()) <= 0)
            && self.sq[i].wr.op.is_read_or_atomic()
        {
            // Everything before this request has been acknowledged by implication.
            self.ack_upto(self.sq[i].first_psn.sub(1), cq);
            let i = self
                .sq
                .iter()
                .position(|w| psn.diff(w.first_psn) >= 0 && psn.diff(w.last_psn()) <= 0);
            let Some(i) = i else { return };
            if i != 0 {
                return; // an earlier READ/atomic is still unanswered: wait (or retransmit)
            }
            let w = &self.sq[0];
            let mtu = self.cfg.path_mtu.map_or(1024, |m| m.bytes()) as u64;
            if info.op.has(mask::READ) {
                let ahead = psn.diff(self.comp.una);
                if ahead < 0 || ahead as u32 >= READ_WINDOW {
                    // Already placed, or too far past a hole to keep: asked again later.
                    return;
                }
                if !self.comp.read_win.has(psn) {
                    let at = psn.diff(w.first_psn) as u64 * mtu;
                    // Each response carries one MTU of the READ, the last what is left: a
                    // response longer or shorter than that is a length error (rxe's
                    // check_length), never placed.
                    let payload = info.payload(frame);
                    if payload.len() as u64 != w.len.saturating_sub(at).min(mtu) {
                        self.fail_front(0, WcStatus::LocLenErr, cq, rcq);
                        return;
                    }
                    if scatter(mrs, self.pd, self.wqe_sg(w), at, payload).is_err() {
                        self.fail_front(0, WcStatus::LocProtErr, cq, rcq);
                        return;
                    }
                    self.comp.read_win.set(psn);
                    self.comp.una = self.comp.read_win.advance(self.comp.una);
                    if self.comp.una.diff(self.sq[0].last_psn()) > 0 {
                        self.complete_upto(1, cq);
                        self.progress();
                        return;
                    }
                    // New data placed: progress, even if it sits past a hole.
                    self.progress();
                }
                if info.op.has(mask::LAST) && !self.comp.retrying {
                    // The stream ended with holes: ask again from the oldest now rather than
                    // wait for the ACK timer (rxe retries at once on a READ response gap).
                    self.counters.implied_nak_seq_err += 1;
                    self.retry(self.comp.una, cq, rcq);
                }
                return;
            }
            if let Some(a) = info.ext.atomic_ack() {
                if scatter(mrs, self.pd, self.wqe_sg(w), 0, &a.orig.to_le_bytes()).is_err() {
                    self.fail_front(0, WcStatus::LocProtErr, cq, rcq);
                    return;
                }
                self.comp.una = psn.add(1);
                self.complete_upto(1, cq);
                self.progress();
            }
            return;
        }
        // A plain ACK covers every SEND/WRITE up to `psn` that was sent whole; it is progress
        // if it completed something or moved the oldest unacknowledged PSN.
        let before = self.comp.una;
        if self.ack_upto(psn, cq) > 0 || self.comp.una.diff(before) > 0 {
            self.progress();
        }
    }

    /// Completes the first `n` work requests successfully.
    pub(super) fn complete_upto(&mut self, n: usize, cq: &mut CompletionQueue) {
        if n > 0 {
            self.comp.read_win.clear();
        }
        debug_assert!(n <= self.sq.len());
        // Read in place, then dropped from the front in one step: popping each entry by value
        // moved all of its 312 bytes (a memcpy call an entry).
        for w in self.sq.range(..n) {
            if self.req.send_idx > 0 {
                self.req.send_idx -= 1;
            } else {
                self.req.send_pkt = 0; // the cursor was inside it (after a rewind): move past it
            }
            if w.wr.op.is_read_or_atomic() {
                self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
                self.sq_rd_atomic -= 1;
            }
            if w.wr.signaled {
                let ns = self.now.saturating_since(w.posted_at).as_nanos() as u64;
                let lat = &mut self.comp.latencies;
                if lat.len() < lat.capacity() {
                    lat.push((w.wr.op.wc_opcode(), ns));
                }
                let len = w.len as u32;
                let _ = cq.push(wc(
                    w.wr.wr_id,
                    WcStatus::Success,
                    w.wr.op.wc_opcode(),
                    len,
                    self.qpn,
                ));
            }
        }
        self.sq.drain(..n);
    }

    /// Completes work request `i` (and, by moving the QP to ERR, flushes all after it and
    /// the receive queue).
    pub(super) fn fail_front(
        &mut self,
        i: usize,
        status: WcStatus,
        cq: &mut CompletionQueue,
        rcq: &mut CompletionQueue,
    ) {
        match status {
            WcStatus::RetryExcErr => self.counters.req_transport_retries_exceeded += 1,
            WcStatus::RnrRetryExcErr => self.counters.req_rnr_retries_exceeded += 1,
            _ => {}
        }
        self.complete_upto(i, cq);
        self.comp.read_win.clear();
        if let Some(w) = self.sq.pop_front() {
            self.sq_rd_atomic -= w.wr.op.is_read_or_atomic() as usize;
            let _ = cq.push(wc(w.wr.wr_id, status, w.wr.op.wc_opcode(), 0, self.qpn));
        }
        self.enter_err(cq, rcq);
    }
}
