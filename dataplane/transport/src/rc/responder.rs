//! The responder: the check chain on each request and its execution (SEND into receives,
//! WRITE and atomics into memory, READ responses queued), duplicates, NAKs and ACKs, CNPs.

use super::*;

/// The responder's state (rxe's `resp` info): the receive queue and the receive being filled,
/// the message in progress, the MSN, the responses (ACKs, READ responses, atomic ACKs, CNPs)
/// waiting to go out before new requests, and the replay cache for duplicate atomics. The
/// expected PSN is the QP's `cfg.rq_psn`.
#[derive(Debug)]
pub(super) struct Responder {
    /// When we last queued a CNP.
    last_cnp: Option<Instant>,
    /// Posted receives not yet started.
    pub(super) rq: VecDeque<RecvWr>,
    /// The receive a multi-packet SEND is filling, and how many bytes it has.
    pub(super) recv_cur: Option<(RecvWr, u64)>,
    /// The WRITE in progress: its region's key and the offset in it of the next byte (as the
    /// check chain resolved it at the first packet).
    write_cur: Option<(u32, usize)>,
    /// The DMA length of the WRITE in progress.
    write_len: u32,
    /// Bytes of the WRITE in progress not yet received (its DMA length less what came).
    write_left: u32,
    /// The multi-packet message in progress.
    pub(super) in_message: InMessage,
    /// A sequence NAK went out for the current gap (one per gap).
    nak_sent: bool,
    /// Packets executed since the last ACK we queued.
    unacked: u32,
    /// Message sequence number: messages completed as responder.
    msn: u32,
    /// READs and atomics accepted and not yet answered (at most max_dest_rd_atomic).
    rd_atomic_outstanding: u8,
    /// Responses waiting to go out; they go before new requests.
    pub(super) responses: VecDeque<Response>,
    /// Original values of recent atomics, by PSN, to answer duplicates without re-executing.
    replay: ArrayVec<(Psn, u64), 16>,
}

impl Responder {
    pub(super) fn new(caps: QpCaps) -> Self {
        Responder {
            rq: VecDeque::with_capacity(caps.max_recv_wr as usize),
            recv_cur: None,
            write_cur: None,
            write_len: 0,
            write_left: 0,
            in_message: InMessage::None,
            nak_sent: false,
            unacked: 0,
            msn: 0,
            rd_atomic_outstanding: 0,
            responses: VecDeque::new(),
            replay: ArrayVec::new(),
            last_cnp: None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Response {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    Read {
        psn: Psn,
        rkey: u32,
        va: u64,
        len: u32,
        next: u32,
        count: u32,
        msn: u32,
        /// A new READ, counted against max_dest_rd_atomic (a duplicate's stream is not).
        counted: bool,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    /// A CNP to the peer QP (we received CE-marked traffic from it).
    Cnp,
}

impl RcQp {
    pub(super) fn send_response<B: PacketBuf>(
        &mut self,
        r: Response,
        mrs: &MrTable,
        out: &mut B,
    ) -> bool {
        match r {
            Response::Ack { psn, syndrome, msn } => {
                let ext = ExtRepr {
                    aeth: Some(aeth::Repr { syndrome, msn }),
                    ..Default::default()
                };
                self.emit_headers(out, &self.bth(op::RC_ACK, psn, false, false), &ext)
            }
            Response::Cnp => {
                self.counters.np_cnp_sent += 1;
                let b = cnp::bth(self.cfg.dest_qp, bth::DEFAULT_PKEY);
                self.emit_headers(out, &b, &ExtRepr::default())
            }
            Response::Atomic { psn, orig, msn } => {
                let ext = ExtRepr {
                    aeth: Some(aeth::Repr {
                        syndrome: Syndrome::Ack { credits: 31 },
                        msn,
                    }),
                    atomic_ack: Some(atomic_ack_eth::Repr { orig }),
                    ..Default::default()
                };
                self.emit_headers(out, &self.bth(op::RC_ATOMIC_ACK, psn, false, false), &ext)
            }
            Response::Read {
                psn,
                rkey,
                va,
                len,
                next,
                count,
                msn,
                counted,
            } => {
                let mtu = self.cfg.path_mtu.map_or(1024, |m| m.bytes());
                let (first, last) = (next == 0, next + 1 == count);
                let opcode = match (first, last) {
                    (true, true) => op::RC_READ_RESPONSE_ONLY,
                    (true, false) => op::RC_READ_RESPONSE_FIRST,
                    (false, false) => op::RC_READ_RESPONSE_MIDDLE,
                    (false, true) => op::RC_READ_RESPONSE_LAST,
                };
                let off = next * mtu;
                let n = (len - off).min(mtu) as usize;
                let ext = if first || last {
                    ExtRepr {
                        aeth: Some(aeth::Repr {
                            syndrome: Syndrome::Ack { credits: 31 },
                            msn,
                        }),
                        ..Default::default()
                    }
                } else {
                    ExtRepr::default()
                };
                let b = self.bth(opcode, psn.add(next), false, false);
                let at = va + off as u64;
                let sg = [Sge {
                    addr: at,
                    length: n as u32,
                    lkey: rkey,
                }];
                let attached = self.emit_attached(out, &b, &ext, mrs, &sg, 0, n);
                self.counters.tx_attached_pkts += attached as u64;
                let ok = attached
                    || matches!(
                        self.emit(out, &b, &ext, n, |dst| mrs.get(rkey)?.read(at, dst)),
                        Some(Ok(()))
                    );
                if !last {
                    self.resp.responses.push_front(Response::Read {
                        psn,
                        rkey,
                        va,
                        len,
                        next: next + 1,
                        count,
                        msn,
                        counted,
                    });
                } else if counted {
                    self.resp.rd_atomic_outstanding =
                        self.resp.rd_atomic_outstanding.saturating_sub(1);
                }
                ok
            }
        }
    }

    /// Notification point: a CE-marked packet from the peer QP arrived; answer with a CNP,
    /// at most one per min_time_between_cnps, never two waiting at once.
    pub(super) fn on_ce(&mut self) {
        self.counters.np_ecn_marked_roce_packets += 1;
        let gap = core::time::Duration::from_micros(self.cc_params.min_time_between_cnps as u64);
        if self.resp.last_cnp.is_some_and(|t| self.now < t + gap)
            || self
                .resp
                .responses
                .iter()
                .any(|r| matches!(r, Response::Cnp))
        {
            return;
        }
        self.resp.last_cnp = Some(self.now);
        // Ahead of data: a CNP is worth most when it arrives soon.
        self.resp.responses.push_front(Response::Cnp);
    }

    // Inlined always: respond queues (or coalesces) one on every in-order request, and as a
    // call it cost 14 instructions a 64 B WRITE more (stream_cost).
    #[inline(always)]
    pub(super) fn push_ack(&mut self, psn: Psn, syndrome: Syndrome) {
        self.resp.unacked = 0;
        let msn = self.resp.msn;
        if let (
            true,
            Some(Response::Ack {
                psn: p,
                syndrome: s,
                msn: m,
            }),
        ) = (syndrome.is_ack(), self.resp.responses.back_mut())
            && s.is_ack()
        {
            // Coalesce: one ACK covers every PSN up to it.
            *p = psn;
            *m = msn;
            return;
        }
        self.resp
            .responses
            .push_back(Response::Ack { psn, syndrome, msn });
    }

    pub(super) fn respond(
        &mut self,
        info: &PacketInfo,
        frame: &[u8],
        mrs: &mut MrTable,
        send_cq: &mut CompletionQueue,
        recv_cq: &mut CompletionQueue,
    ) {
        let req = Request {
            opcode: info.opcode,
            psn: info.psn,
            payload_len: info.payload_len as u32,
            reth: info.ext.reth(),
            atomic: info.ext.atomic_eth(),
        };
        let st = ResponderState {
            expected: self.cfg.rq_psn,
            nak_sent: self.resp.nak_sent,
            in_message: self.resp.in_message,
            access: self.cfg.access,
            pd: self.pd,
            mtu: match self.cfg.path_mtu {
                Some(m) => m,
                None => return,
            },
            rd_atomic_outstanding: self.resp.rd_atomic_outstanding,
            max_dest_rd_atomic: self.cfg.max_dest_rd_atomic,
            min_rnr_timer: self.cfg.min_rnr_timer,
            recv_available: !self.resp.rq.is_empty(),
            write_left: self.resp.write_left,
        };
        let off = match check(&st, &req, mrs) {
            Verdict::Execute { mr_offset } => mr_offset,
            Verdict::Duplicate => {
                self.counters.duplicate_request += 1;
                if let (true, Some(r)) = (info.op.has(mask::READ), req.reth) {
                    // Re-execute a duplicate READ from the PSN it asks for. A response stream
                    // still queued for the same READ (one whose PSNs reach the asked PSN) is
                    // superseded, so repeated asks never pile up streams or exhaust
                    // max_dest_rd_atomic.
                    let mut superseded = 0;
                    self.resp.responses.retain(|x| match x {
                        Response::Read {
                            psn,
                            next,
                            count,
                            counted,
                            ..
                        } => {
                            let (from, to) = (psn.add(*next), psn.add(count - 1));
                            let same = info.psn.diff(from) >= 0 && info.psn.diff(to) <= 0
                                || from.diff(info.psn) >= 0 && psn.diff(info.psn) <= 0;
                            superseded += (same && *counted) as u8;
                            !same
                        }
                        _ => true,
                    });
                    self.resp.rd_atomic_outstanding =
                        self.resp.rd_atomic_outstanding.saturating_sub(superseded);
                    let count = r.dma_len.div_ceil(st.mtu.bytes()).max(1);
                    // The duplicate's stream replays a READ already admitted: it does not count
                    // against max_dest_rd_atomic, so re-asks can never crowd out new READs.
                    self.resp.responses.push_back(r_read(
                        info.psn,
                        r.rkey,
                        r.va,
                        r.dma_len,
                        count,
                        self.resp.msn,
                        false,
                    ));
                } else if info.op.has(mask::ATOMIC) {
                    // Answer a duplicate atomic from the replay cache; never execute it twice.
                    if let Some((_, orig)) = self.resp.replay.iter().find(|(p, _)| *p == info.psn) {
                        let orig = *orig;
                        self.resp.responses.push_back(Response::Atomic {
                            psn: info.psn,
                            orig,
                            msn: self.resp.msn,
                        });
                    }
                } else {
                    self.push_ack(self.cfg.rq_psn.sub(1), Syndrome::Ack { credits: 31 });
                }
                return;
            }
            Verdict::Drop => {
                self.counters.out_of_sequence += 1;
                return;
            }
            Verdict::Nak(code) => {
                if code == NakCode::PsnSequenceError {
                    self.counters.out_of_sequence += 1;
                    self.resp.nak_sent = true;
                }
                self.push_ack(self.cfg.rq_psn, Syndrome::Nak(code));
                if code != NakCode::PsnSequenceError {
                    self.enter_err(send_cq, recv_cq);
                }
                return;
            }
            Verdict::RnrNak(t) => {
                self.counters.out_of_buffer += 1;
                self.push_ack(self.cfg.rq_psn, Syndrome::RnrNak { timer: t });
                return;
            }
        };
        self.resp.nak_sent = false;
        let o = info.op;
        let payload = info.payload(frame);
        if o.has(mask::SEND) {
            if o.has(mask::FIRST) {
                self.resp.recv_cur = self.resp.rq.pop_front().map(|w| (w, 0));
            }
            let Some((wr, at)) = self.resp.recv_cur.as_mut() else {
                return;
            };
            // A SEND longer than its receive is a length error before anything is placed
            // (rxe checks the receive's room first too).
            let room: u64 = wr.sg.iter().map(|s| s.length as u64).sum();
            if *at + payload.len() as u64 > room
                || scatter(mrs, self.pd, &wr.sg, *at, payload).is_err()
            {
                let wr_id = wr.wr_id;
                let _ = recv_cq.push(wc(wr_id, WcStatus::LocLenErr, WcOpcode::Recv, 0, self.qpn));
                self.resp.recv_cur = None;
                self.push_ack(info.psn, Syndrome::Nak(NakCode::InvalidRequest));
                self.enter_err(send_cq, recv_cq);
                return;
            }
            *at += payload.len() as u64;
            self.resp.in_message = if o.has(mask::LAST) {
                InMessage::None
            } else {
                InMessage::Send
            };
            if o.has(mask::LAST) {
                let (wr, len) = self.resp.recv_cur.take().expect("receive in progress");
                let mut c = wc(
                    wr.wr_id,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    len as u32,
                    self.qpn,
                );
                c.imm_data = info.ext.immdt();
                c.invalidated_rkey = info.ext.ieth();
                let _ = recv_cq.push(c);
                self.resp.msn = self.resp.msn.wrapping_add(1) & 0x00ff_ffff;
            }
        } else if o.has(mask::WRITE) {
            self.counters.rx_write_requests += 1;
            if let Some(r) = req.reth {
                // Where the check chain resolved the RETH's address: the message's bytes
                // land from there, packet after packet, without resolving it again.
                self.resp.write_cur = Some((r.rkey, off));
                self.resp.write_len = r.dma_len;
                self.resp.write_left = r.dma_len;
            }
            let Some((rkey, at)) = self.resp.write_cur else {
                return;
            };
            // By key still: a region deregistered mid-message stops the WRITE.
            match mrs.get_mut(rkey).and_then(|m| m.write_at(at, payload)) {
                Ok(()) => {}
                Err(_) => {
                    self.push_ack(info.psn, Syndrome::Nak(NakCode::RemoteAccessError));
                    self.enter_err(send_cq, recv_cq);
                    return;
                }
            }
            self.resp.write_cur = Some((rkey, at + payload.len()));
            self.resp.write_left -= payload.len() as u32; // the checks held it to write_left
            self.resp.in_message = if o.has(mask::LAST) {
                InMessage::None
            } else {
                InMessage::Write
            };
            if o.has(mask::LAST) {
                self.resp.write_cur = None;
                if let Some(imm) = info.ext.immdt()
                    && let Some(w) = self.resp.rq.pop_front()
                {
                    let mut c = wc(
                        w.wr_id,
                        WcStatus::Success,
                        WcOpcode::RecvRdmaWithImm,
                        self.resp.write_len,
                        self.qpn,
                    );
                    c.imm_data = Some(imm);
                    let _ = recv_cq.push(c);
                }
                self.resp.msn = self.resp.msn.wrapping_add(1) & 0x00ff_ffff;
            }
        } else if o.has(mask::READ) {
            self.counters.rx_read_requests += 1;
            let r = req.reth.expect("checked");
            let mtu = st.mtu.bytes();
            let count = r.dma_len.div_ceil(mtu).max(1);
            self.resp.msn = self.resp.msn.wrapping_add(1) & 0x00ff_ffff;
            self.resp.rd_atomic_outstanding += 1;
            self.resp.responses.push_back(r_read(
                info.psn,
                r.rkey,
                r.va,
                r.dma_len,
                count,
                self.resp.msn,
                true,
            ));
            self.cfg.rq_psn = self.cfg.rq_psn.add(count);
            return;
        } else if o.has(mask::ATOMIC) {
            self.counters.rx_atomic_requests += 1;
            let a = req.atomic.expect("checked");
            let aop = if info.opcode == op::RC_CMP_SWAP {
                AtomicOp::CompareSwap {
                    compare: a.compare,
                    swap: a.swap_add,
                }
            } else {
                AtomicOp::FetchAdd(a.swap_add)
            };
            let Ok(orig) = mrs.get_mut(a.rkey).and_then(|m| m.atomic_at(off, aop)) else {
                return;
            };
            if self.resp.replay.is_full() {
                self.resp.replay.remove(0);
            }
            self.resp.replay.push((info.psn, orig));
            self.resp.msn = self.resp.msn.wrapping_add(1) & 0x00ff_ffff;
            self.resp.responses.push_back(Response::Atomic {
                psn: info.psn,
                orig,
                msn: self.resp.msn,
            });
            self.cfg.rq_psn = self.cfg.rq_psn.add(1);
            return;
        }
        self.cfg.rq_psn = self.cfg.rq_psn.add(1);
        // ACK when asked, at the end of a message, or after ACK_EVERY packets without one
        // (a peer that rarely sets AckReq still hears from us); queued ACKs coalesce.
        self.resp.unacked += 1;
        if info.ack_req || o.has(mask::LAST) || self.resp.unacked >= ACK_EVERY {
            self.push_ack(info.psn, Syndrome::Ack { credits: 31 });
        }
    }
}

pub(super) fn r_read(
    psn: Psn,
    rkey: u32,
    va: u64,
    len: u32,
    count: u32,
    msn: u32,
    counted: bool,
) -> Response {
    Response::Read {
        counted,
        psn,
        rkey,
        va,
        len,
        next: 0,
        count,
        msn,
    }
}
