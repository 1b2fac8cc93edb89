//! Unreliable datagram: a UD QP's activation, its datagrams out and in.

use super::*;

impl RcQp {
    /// Takes a UD QP in RESET through INIT (its Q_Key, and the MTU its datagrams may fill)
    /// and RTR to RTS, first PSN `sq_psn`: UD's counterpart of [`RcQp::connect`].
    pub fn activate_ud(
        &mut self,
        qkey: u32,
        mtu: crate::qp::Mtu,
        sq_psn: u32,
    ) -> Result<(), crate::qp::ModifyError> {
        use crate::qp::QpAttr;
        for a in [
            QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                qkey: Some(qkey),
                path_mtu: Some(mtu),
                ..Default::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                ..Default::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(sq_psn),
                ..Default::default()
            },
        ] {
            self.modify(&a)?;
        }
        Ok(())
    }

    /// A UD QP's next datagram: the oldest send, as one UD SEND (with immediate) to the
    /// destination it names, with a DETH carrying its Q_Key and our QPN, no AckReq. Nothing
    /// acknowledges it, so it completes once it is on its way (as on rxe).
    pub(super) fn next_datagram<B: PacketBuf>(
        &mut self,
        mrs: &MrTable,
        scq: &mut CompletionQueue,
        rcq: &mut CompletionQueue,
        out: &mut B,
    ) -> bool {
        if self.cfg.state != QpState::Rts {
            return false;
        }
        let Some(w) = self.sq.front() else {
            return false;
        };
        let Some(d) = self.req.ud.get(w.slot as usize).copied() else {
            return false; // post() refuses these
        };
        let imm = match w.wr.op {
            SendOp::SendWithImm(i) => Some(i),
            _ => None,
        };
        let b = bth::Repr {
            opcode: if imm.is_some() {
                op::UD_SEND_ONLY_IMM
            } else {
                op::UD_SEND_ONLY
            },
            se: w.wr.solicited,
            pkey: bth::DEFAULT_PKEY,
            dest_qp: d.dest_qp,
            ack_req: false,
            psn: w.first_psn,
            ..Default::default()
        };
        let ext = ExtRepr {
            deth: Some(deth::Repr {
                qkey: d.qkey,
                resv8: 0,
                src_qp: self.qpn,
            }),
            immdt: imm,
            ..Default::default()
        };
        let inline = w
            .inline_at
            .map(|at| &self.req.inline_buf[at..at + w.len as usize]);
        let sg = self.wqe_sg(w);
        let built = self.emit_on(&d.path, out, &b, &ext, w.len as usize, |dst| match inline {
            Some(x) => {
                dst.copy_from_slice(x);
                Ok(())
            }
            None => gather(mrs, self.pd, sg, 0, dst),
        });
        match built {
            Some(Ok(())) => {
                self.complete_upto(1, scq);
                true
            }
            Some(Err(_)) => {
                self.fail_front(0, WcStatus::LocProtErr, scq, rcq);
                false
            }
            None => false,
        }
    }

    /// A datagram for this UD QP: dropped unless the QP receives, it is a UD SEND and its
    /// Q_Key is ours (counted as a Q_Key violation) and a receive is posted (counted as
    /// out_of_buffer: UD has no RNR). The receive gets the 40-byte GRH area first (for IPv4,
    /// the IP header in its last 20 bytes, as rxe writes it), then the payload; its completion
    /// carries the sender's QPN and GRH + payload bytes. A receive too small for both completes
    /// with LOC_LEN_ERR and the QP goes to ERR.
    pub(super) fn receive_datagram(
        &mut self,
        info: &PacketInfo,
        frame: &[u8],
        mrs: &mut MrTable,
        send_cq: &mut CompletionQueue,
        recv_cq: &mut CompletionQueue,
    ) {
        if !matches!(
            self.cfg.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) || !info.op.has(mask::UD)
        {
            return;
        }
        let Some(d) = info.ext.deth() else {
            return;
        };
        if d.qkey != self.cfg.qkey {
            self.counters.qkey_violations += 1;
            return;
        }
        let Some(wr) = self.resp.rq.pop_front() else {
            self.counters.out_of_buffer += 1;
            return;
        };
        let payload = info.payload(frame);
        let mut grh = [0u8; UD_GRH_LEN];
        let ip = &frame[info.l3_off as usize..];
        if info.src_ip.is_ipv4() {
            grh[20..].copy_from_slice(&ip[..20]);
        } else {
            grh.copy_from_slice(&ip[..UD_GRH_LEN]);
        }
        let placed = scatter(mrs, self.pd, &wr.sg, 0, &grh)
            .and_then(|()| scatter(mrs, self.pd, &wr.sg, UD_GRH_LEN as u64, payload));
        if placed.is_err() {
            let _ = recv_cq.push(wc(
                wr.wr_id,
                WcStatus::LocLenErr,
                WcOpcode::Recv,
                0,
                self.qpn,
            ));
            self.enter_err(send_cq, recv_cq);
            return;
        }
        let mut c = wc(
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            (UD_GRH_LEN + payload.len()) as u32,
            self.qpn,
        );
        c.imm_data = info.ext.immdt();
        c.src_qp = Some(d.src_qp);
        let _ = recv_cq.push(c);
    }
}
