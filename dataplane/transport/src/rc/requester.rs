//! The requester: the next request packet from the send queue (planned on demand, so
//! go-back-N regenerates any packet from its PSN), and going back.

use super::*;

/// The requester's state (rxe's `req` info): where in the send queue the next request packet
/// comes from, the PSNs, the READ/atomic budget in flight, pacing, and the inline slots
/// posting fills. The send queue itself is the QP's (the completer retires it).
#[derive(Debug)]
pub(super) struct Requester {
    /// Inline data of posted work requests: one slot of max_inline_data bytes per send queue
    /// entry, used in posting order (the send queue completes in order, so slots never clash).
    pub(super) inline_buf: Vec<u8>,
    /// SG lists of posted work requests: max_send_sge entries per send queue slot.
    pub(super) sge: Vec<Sge>,
    /// UD destinations of posted work requests, one per slot (UD QPs only; empty on RC).
    pub(super) ud: Vec<UdDest>,
    /// Send work requests ever posted (picks the inline slot).
    pub(super) posted: u64,
    /// The send queue entry the next request packet belongs to.
    pub(super) send_idx: usize,
    /// Which packet of that entry is next.
    pub(super) send_pkt: u32,
    /// The PSN the next posted work request starts at.
    pub(super) next_psn: Psn,
    /// READs and atomics sent and not yet answered (at most max_rd_atomic).
    pub(super) rd_atomic_inflight: u8,
    /// One past the highest PSN ever sent (a rewind does not lower it).
    pub(super) sent_hw: Psn,
    /// Earliest time the next request packet may leave (pacing while rate limited).
    pub(super) next_send: Instant,
}

impl Requester {
    pub(super) fn new(caps: QpCaps) -> Self {
        Requester {
            inline_buf: vec![0; caps.max_send_wr as usize * caps.max_inline_data as usize],
            sge: vec![
                Sge {
                    addr: 0,
                    length: 0,
                    lkey: 0
                };
                caps.max_send_wr as usize * caps.max_send_sge as usize
            ],
            ud: Vec::with_capacity(if caps.qp_type == QpType::Ud {
                caps.max_send_wr as usize
            } else {
                0
            }),
            posted: 0,
            send_idx: 0,
            send_pkt: 0,
            next_psn: Psn::new(0),
            rd_atomic_inflight: 0,
            sent_hw: Psn::new(0),
            next_send: Instant::ZERO,
        }
    }
}

impl RcQp {
    pub(super) fn next_frame<B: PacketBuf>(
        &mut self,
        now: Instant,
        mrs: &MrTable,
        scq: &mut CompletionQueue,
        rcq: &mut CompletionQueue,
        out: &mut B,
    ) -> bool {
        self.now = self.now.max(now);
        if self.cfg.qp_type == QpType::Ud {
            return self.next_datagram(mrs, scq, rcq, out);
        }
        if self.cfg.path.is_none() {
            return false;
        }
        if let Some(r) = self.resp.responses.pop_front() {
            return self.send_response(r, mrs, out);
        }
        let drains = self.cfg.state == QpState::Sqd
            && self
                .sq
                .get(self.req.send_idx)
                .is_some_and(|w| w.first_psn.diff(self.req.sent_hw) < 0);
        if !(self.cfg.state == QpState::Rts || drains)
            || self.req.send_idx >= self.sq.len()
            || self.comp.rnr_until.is_some()
            || self.paced() && self.now < self.req.next_send
        {
            // In SQD only messages already begun go on (and are resent): the send queue
            // drains without starting new work.
            return false;
        }
        let w = &self.sq[self.req.send_idx];
        if self.req.send_pkt == 0
            && (w.wr.op.is_read_or_atomic()
                && self.req.rd_atomic_inflight >= self.cfg.max_rd_atomic
                || w.wr.fence && self.req.rd_atomic_inflight > 0)
        {
            return false;
        }
        let mut pk = w.plan.packet(self.req.send_pkt);
        let opv = w.wr.op;
        let mut ext = ext_headers(opv, &pk, w.len);
        // A READ resent after some of its responses arrived asks only for the rest, from the
        // oldest PSN still missing (as rxe does): a long READ over a lossy path would otherwise
        // never finish.
        if let (SendOp::Read { .. }, Some(r)) = (opv, ext.reth.as_mut())
            && self.comp.una.diff(w.first_psn) > 0
            && self.comp.una.diff(w.last_psn()) <= 0
        {
            let skip = self.comp.una.diff(w.first_psn) as u32
                * self.cfg.path_mtu.map_or(1024, |m| m.bytes());
            r.va += skip as u64;
            r.dma_len = r.dma_len.saturating_sub(skip);
            pk.psn = self.comp.una;
        }
        let b = self.bth(pk.opcode, pk.psn, pk.ack_req, w.wr.solicited && pk.last);
        let sg = self.wqe_sg(w); // borrowed, not copied: emit() only reads self
        let inline = w
            .inline_at
            .map(|at| &self.req.inline_buf[at..at + w.len as usize]);
        let payload = if matches!(
            opv,
            SendOp::Read { .. } | SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. }
        ) {
            0
        } else {
            pk.len as usize
        };
        let attached = inline.is_none()
            && self.emit_attached(out, &b, &ext, mrs, sg, pk.offset as u64, payload);
        let built = if attached {
            self.counters.tx_attached_pkts += 1;
            Some(Ok(()))
        } else {
            self.emit(out, &b, &ext, payload, |dst| match inline {
                Some(d) => {
                    dst.copy_from_slice(&d[pk.offset as usize..][..dst.len()]);
                    Ok(())
                }
                None => gather(mrs, self.pd, sg, pk.offset as u64, dst),
            })
        };
        match built {
            Some(Ok(())) => {}
            Some(Err(_)) => {
                // The local SG list is bad: complete in error and stop the QP.
                self.fail_front(self.req.send_idx, WcStatus::LocProtErr, scq, rcq);
                return false;
            }
            None => return false,
        }
        if self.comp.ack_deadline.is_none() {
            self.comp.ack_deadline = self.cfg.ack_timeout().map(|t| self.now + t);
        }
        self.cc.on_sent(out.frame_len() as u64, &self.cc_params);
        self.req.next_send = if self.paced() {
            // Wire bytes (with preamble, FCS and gap) at the QP's current rate.
            let ns = (out.frame_len() + 24) as f64 * 8e9 / self.cc.rate();
            self.req.next_send.max(self.now) + core::time::Duration::from_nanos(ns as u64)
        } else {
            self.now
        };
        let w = &self.sq[self.req.send_idx];
        let end = if opv.is_read_or_atomic() {
            w.first_psn.add(w.plan.psns)
        } else {
            pk.psn.add(1)
        };
        if end.diff(self.req.sent_hw) > 0 {
            self.req.sent_hw = end;
        }
        if pk.last {
            if opv.is_read_or_atomic() {
                self.req.rd_atomic_inflight += 1;
            }
            self.req.send_idx += 1;
            self.req.send_pkt = 0;
        } else {
            self.req.send_pkt += 1;
        }
        true
    }

    /// Retries from `psn` (go back N), or completes the front request with RETRY_EXC_ERR when
    /// retry_cnt tries have gone without progress. Until something new is acknowledged,
    /// acknowledgements still in flight from before start no other retry.
    pub(super) fn retry(&mut self, psn: Psn, scq: &mut CompletionQueue, rcq: &mut CompletionQueue) {
        self.comp.retrying = true;
        if self.comp.retries_left == 0 {
            self.fail_front(0, WcStatus::RetryExcErr, scq, rcq);
            return;
        }
        self.comp.retries_left -= 1;
        self.rewind(psn);
        // The timer runs again from now, whether or not the resend can leave.
        self.arm_ack_timer();
    }

    /// Go back N: send again from `psn`.
    pub(super) fn rewind(&mut self, psn: Psn) {
        let i = self
            .sq
            .iter()
            .position(|w| psn.diff(w.first_psn) >= 0 && psn.diff(w.last_psn()) <= 0)
            .unwrap_or(0);
        self.req.send_idx = i;
        self.req.send_pkt = match self.sq.get(i) {
            Some(w) if !w.wr.op.is_read_or_atomic() => psn.diff(w.first_psn).max(0) as u32,
            _ => 0,
        };
        self.req.rd_atomic_inflight = self
            .sq
            .iter()
            .take(i)
            .filter(|w| w.wr.op.is_read_or_atomic())
            .count() as u8;
        self.comp.ack_deadline = None;
    }
}
