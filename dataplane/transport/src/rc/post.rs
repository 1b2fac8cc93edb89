//! Posting: one entry point for send work requests (inline, gathered or by reference are
//! its arguments), the admission checks they pass, and receives.

use super::*;

impl RcQp {
    /// Posts a send work request: the one entry point. `wr_id` is the id its completion
    /// carries (a stream posts copies of one request under ids of their own; `wr` is copied
    /// once, into the send queue). `inline` is its payload, copied now (verbs'
    /// IBV_SEND_INLINE: the caller's buffer is free again as soon as this returns, and no
    /// local key is involved), up to max_inline_data bytes of a SEND or WRITE; the SG list
    /// must then be empty, or, for a request flagged inline, the one the bytes were gathered
    /// from ([`crate::wr::take_inline`], [`crate::wr::inline_bytes`]). Without `inline` a
    /// request flagged inline is refused: its bytes must be gathered first (the QP has no
    /// regions).
    // Inlined: stream_cost counts 32 instructions a 64 B WRITE more when it is not (its
    // caller, a stream's refill, is in another module).
    #[inline]
    pub fn post_send(
        &mut self,
        wr: &SendWr,
        wr_id: u64,
        inline: Option<&[u8]>,
    ) -> Result<(), PostError> {
        let bad_inline = match inline {
            Some(d) => {
                d.len() > self.caps.max_inline_data as usize
                    || wr.op.is_read_or_atomic()
                    || (!wr.inline && !wr.sg.is_empty())
            }
            None => wr.inline && !wr.sg.is_empty(),
        };
        if bad_inline {
            return Err(WrError::BadInline.into());
        }
        let (p, len) = self.admit(wr, inline)?;
        let slot = (self.req.posted % self.caps.max_send_wr as u64) as usize;
        let inline_at = self.take_inline_bytes(inline);
        // The SG list (none for inline bytes, which replace it) and a UD destination go to the
        // request's slot of the side tables; admit held the list to max_send_sge.
        let sg: &[Sge] = if inline.is_some() { &[] } else { &wr.sg };
        let at = slot * self.caps.max_send_sge as usize;
        match sg {
            [one] => self.req.sge[at] = *one, // most requests: no memcpy call
            _ => self.req.sge[at..at + sg.len()].copy_from_slice(sg),
        }
        if let Some(d) = wr.ud {
            if self.req.ud.len() <= slot {
                self.req.ud.resize(slot + 1, d); // the first time round (allocated at creation)
            }
            self.req.ud[slot] = d;
        }
        let first_psn = self.advance(&p);
        self.sq_rd_atomic += wr.op.is_read_or_atomic() as usize;
        self.sq.push_back(SendWqe {
            wr: QueuedWr {
                wr_id,
                op: wr.op,
                signaled: wr.signaled,
                solicited: wr.solicited,
                fence: wr.fence,
                sg_len: sg.len() as u8,
            },
            slot: slot as u32,
            sge_at: at as u32,
            plan: p,
            first_psn,
            len,
            inline_at,
            posted_at: self.now,
        });
        self.arm_ack_timer();
        Ok(())
    }

    /// Whether `wr` (with `inline` bytes in place of its SG list, if given) may be posted
    /// now: its plan and message length, or why not.
    #[inline]
    pub(super) fn admit(
        &self,
        wr: &SendWr,
        inline: Option<&[u8]>,
    ) -> Result<(Plan, u64), PostError> {
        if !matches!(self.cfg.state, QpState::Rts | QpState::Sqd) {
            return Err(PostError::BadState);
        }
        if self.sq.len() >= self.caps.max_send_wr as usize {
            return Err(PostError::Full);
        }
        if inline.is_none() && wr.sg.len() > self.caps.max_send_sge as usize {
            return Err(WrError::TooManySge.into());
        }
        let ud = self.cfg.qp_type == QpType::Ud;
        if ud != wr.ud.is_some() || wr.ud.is_some_and(|d| !d.path.is_valid()) {
            return Err(WrError::UdDest.into());
        }
        let mtu = self.cfg.path_mtu.ok_or(PostError::BadState)?;
        let len = inline.map_or_else(|| wr.length(), |d| d.len() as u64);
        if ud {
            if !matches!(wr.op, SendOp::Send | SendOp::SendWithImm(_)) {
                return Err(WrError::UdOp.into());
            }
            if len > mtu.bytes() as u64 {
                return Err(WrError::UdTooLong.into());
            }
        }
        Ok((plan(wr.op, len, mtu, self.req.next_psn)?, len))
    }

    /// The SG list of a queued request, from its slot of the side table.
    #[inline]
    pub(super) fn wqe_sg(&self, w: &SendWqe) -> &[Sge] {
        let at = w.sge_at as usize;
        &self.req.sge[at..at + w.wr.sg_len as usize]
    }

    /// Copies a request's inline bytes into its slot of the QP's inline buffer.
    pub(super) fn take_inline_bytes(&mut self, inline: Option<&[u8]>) -> Option<usize> {
        inline.map(|d| {
            let slot = (self.req.posted % self.caps.max_send_wr as u64) as usize;
            let at = slot * self.caps.max_inline_data as usize;
            self.req.inline_buf[at..at + d.len()].copy_from_slice(d);
            at
        })
    }

    /// Counts a posted request and takes its PSNs: the first.
    pub(super) fn advance(&mut self, p: &Plan) -> Psn {
        self.req.posted += 1;
        let first_psn = self.req.next_psn;
        self.req.next_psn = self.req.next_psn.add(p.psns);
        first_psn
    }

    /// Posts a receive work request.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.cfg.state == QpState::Reset {
            return Err(PostError::BadState);
        }
        if self.resp.rq.len() >= self.caps.max_recv_wr as usize {
            return Err(PostError::Full);
        }
        if wr.sg.len() > self.caps.max_recv_sge as usize {
            return Err(WrError::TooManySge.into());
        }
        self.resp.rq.push_back(wr);
        // Posted to a QP in ERR: taken, and completed with WR_FLUSH_ERR (as verbs and rxe
        // do) by the timeout `poll_timeout` then asks for at once.
        self.flush_due |= self.cfg.state == QpState::Err;
        Ok(())
    }

    /// Work requests posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.sq.len()
    }
}
