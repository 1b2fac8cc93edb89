//! The device's verbs: one method per call, each answering a value or a typed
//! [`DeviceError`] (the REST API maps them to status codes; nothing here knows HTTP).

use super::{Claim, Device, DeviceError, QPN_SHARD_SHIFT};
use crate::cc::{Cc, CcKind, DcqcnParams};
use crate::cq::{CompletionQueue, LatencyHistograms, WorkCompletion};
use crate::mr::{Access, MrError, MrMemory, PdHandle};
use crate::qp::{QpAttr, QpConfig, QpState, QpType};
use crate::rc::{QpCaps, QpCounters};
use crate::wr::{RecvWr, SendWr};
use wire::time::Instant;

/// A completion queue's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqState {
    /// Capacity.
    pub cqe: usize,
    /// Completions waiting.
    pub waiting: usize,
    /// QPs whose send or receive completions go to it.
    pub users: u32,
    /// It overflowed (completions were lost; its QPs' completions are refused from then on).
    pub in_error: bool,
}

/// What [`Device::query`] tells of a QP.
#[derive(Clone, Debug)]
pub struct QpQuery {
    /// Its protection domain.
    pub pd: u32,
    /// The created CQs its send and receive completions go to (None: its own).
    pub cqs: [Option<u32>; 2],
    /// Its attributes (state, PSNs, remote QP, path, ...).
    pub cfg: QpConfig,
    /// Its counters.
    pub counters: QpCounters,
    /// The port its packets leave by.
    pub port: usize,
    /// Its caps.
    pub caps: QpCaps,
    /// Its DCQCN settings (used when its congestion control is DCQCN).
    pub cc_params: DcqcnParams,
    /// Its congestion control: "dcqcn" or "none".
    pub cc_kind: &'static str,
    /// The rate it may send at now, bits per second.
    pub rate_bps: f64,
    /// DCQCN's target rate and alpha (None without DCQCN).
    pub dcqcn: Option<(f64, f64)>,
}

/// DCQCN over one shard's QPs at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DcqcnSummary {
    /// QPs whose congestion control is DCQCN.
    pub qps: u32,
    /// Of those, QPs sending below the line rate (cut by CNPs and not yet recovered).
    pub limited: u32,
    /// The lowest current rate among them, bits per second (0 without any).
    pub min_rate_bps: f64,
    /// Their current rates summed, bits per second.
    pub sum_rate_bps: f64,
    /// The highest alpha (DCQCN's congestion estimate, 0 to 1) among them.
    pub max_alpha: f64,
}

/// What a shard's QPs report together.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceCounters {
    /// Its QPs' counters summed (destroyed QPs included).
    pub qp: QpCounters,
    /// Its QPs now, by state (indexed as [`QpState::ALL`]).
    pub qp_states: [u32; 7],
    /// Its QPs under DCQCN now.
    pub dcqcn: DcqcnSummary,
}

impl Device {
    /// Registers `len` zeroed bytes at virtual address `va` with `access` in the default PD;
    /// the key (lkey = rkey).
    pub fn reg_mr(&mut self, va: u64, len: usize, access: Access) -> Result<u32, MrError> {
        self.mrs
            .register(self.pd, va, Box::new(vec![0u8; len]), access)
    }

    /// Installs a region registered node-wide: the same key, address and memory on every
    /// shard, so any shard's QPs can use it.
    pub fn reg_shared(
        &mut self,
        key: u32,
        pd: u32,
        va: u64,
        access: Access,
        mem: Box<dyn MrMemory>,
    ) -> Result<(), MrError> {
        self.mrs.register_at(PdHandle(pd), key, va, mem, access)
    }

    /// Removes a region; its key stops working here at once.
    pub fn dereg_mr(&mut self, key: u32) -> Result<(), MrError> {
        self.mrs.deregister(key).map(drop)
    }

    /// Copies `data` into a region at `va` (an operator's or test's slow path).
    pub fn write_mr(&mut self, key: u32, va: u64, data: &[u8]) -> Result<(), MrError> {
        self.mrs.get_mut(key).and_then(|m| m.write(va, data))
    }

    /// Reads `len` bytes of a region at `va`.
    pub fn read_mr(&self, key: u32, va: u64, len: usize) -> Result<Vec<u8>, MrError> {
        self.mrs.get(key).and_then(|m| m.to_vec(va, len))
    }

    /// Makes `pd` a protection domain here (the control plane numbers them).
    pub fn alloc_pd(&mut self, pd: u32) {
        self.mrs.ensure_pd(PdHandle(pd));
    }

    /// Frees a protection domain; refused while a region or QP of this shard is in it.
    pub fn dealloc_pd(&mut self, pd: u32) -> Result<(), DeviceError> {
        let pd = PdHandle(pd);
        if self.slots().any(|(_, s)| s.qp.pd == pd) {
            return Err(DeviceError::PdInUse(pd.0));
        }
        Ok(self.mrs.dealloc_pd(pd)?)
    }

    /// Creates a completion queue for `cqe` completions; its number (bits 20-23 name the
    /// shard, as in QPNs).
    pub fn create_cq(&mut self, cqe: usize) -> Result<u32, DeviceError> {
        let i = match self.cq_free.pop() {
            Some(i) => i,
            None if self.cqs.len() < 1 << QPN_SHARD_SHIFT => {
                self.cqs.push(None);
                self.cqs.len() as u32 - 1
            }
            None => return Err(DeviceError::NoCqNumbers),
        };
        self.cqs[i as usize] = Some((CompletionQueue::new(cqe), 0));
        Ok(self.qpn(i))
    }

    /// Destroys a CQ; refused while a QP uses it.
    pub fn destroy_cq(&mut self, cqn: u32) -> Result<(), DeviceError> {
        let i = self.cq_index(cqn).ok_or(DeviceError::NoCq(cqn))?;
        if let Some((_, users)) = self.cqs[i].as_ref()
            && *users > 0
        {
            return Err(DeviceError::CqInUse { cqn, users: *users });
        }
        self.cqs[i] = None;
        self.cq_free.push(i as u32);
        Ok(())
    }

    /// Takes up to `max` completions from a CQ (0: only its state); None if there is no such
    /// CQ.
    pub fn poll_cqn(&mut self, cqn: u32, max: usize) -> Option<(Vec<WorkCompletion>, CqState)> {
        let i = self.cq_index(cqn)?;
        let (cq, users) = self.cqs[i].as_mut()?;
        let mut wcs = Vec::new();
        cq.poll(max, &mut wcs);
        let state = CqState {
            cqe: cq.capacity(),
            waiting: cq.len(),
            users: *users,
            in_error: cq.in_error(),
        };
        Some((wcs, state))
    }

    /// Creates `count` QPs in RESET (default PD, CQs of their own), all or none.
    pub fn create_qps(
        &mut self,
        count: usize,
        caps: QpCaps,
        cc: CcKind,
        params: DcqcnParams,
    ) -> Result<Vec<u32>, DeviceError> {
        let mut made = Vec::with_capacity(count);
        for _ in 0..count {
            match self.create_qp(caps, None, [None; 2], cc, params) {
                Ok(q) => made.push(q),
                Err(e) => {
                    for q in made {
                        self.destroy_qp(q);
                    }
                    return Err(e);
                }
            }
        }
        Ok(made)
    }

    /// Destroys several QPs; how many of them existed and are gone.
    pub fn destroy_qps(&mut self, qpns: &[u32]) -> usize {
        qpns.iter().filter(|&&q| self.destroy_qp(q)).count()
    }

    /// Takes a QP to RTS, its packets leaving by `port`.
    pub fn connect(&mut self, qpn: u32, c: &QpAttr, port: usize) -> Result<(), DeviceError> {
        let (_, s) = self.slot_of(qpn)?;
        s.qp.connect(c)?;
        s.port = port;
        Ok(())
    }

    /// Takes several QPs to RTS, their packets leaving by `port`; all or none (the ones
    /// connected go back to RESET when one refuses).
    pub fn connect_many(&mut self, list: &[(u32, QpAttr)], port: usize) -> Result<(), DeviceError> {
        for (done, (qpn, c)) in list.iter().enumerate() {
            if let Err(e) = self.connect(*qpn, c, port) {
                let reset = QpAttr {
                    state: Some(QpState::Reset),
                    ..Default::default()
                };
                for (q, _) in &list[..done] {
                    if let Ok((_, s)) = self.slot_of(*q) {
                        let _ = s.qp.modify(&reset);
                    }
                }
                return Err(DeviceError::Member {
                    qpn: *qpn,
                    source: Box::new(e),
                });
            }
        }
        Ok(())
    }

    /// Modifies a QP (ibv_modify_qp); `port` is the port its packets leave by when the
    /// attributes give a path (RC) or at INIT (UD: verbs' port_num).
    pub fn modify(&mut self, qpn: u32, attr: &QpAttr, port: usize) -> Result<(), DeviceError> {
        let (i, s) = self.slot_of(qpn)?;
        let r = s.qp.modify(attr).map_err(DeviceError::from).map(|()| {
            let ud_init = s.qp.cfg.qp_type == QpType::Ud && attr.state == Some(QpState::Init);
            if attr.path.is_some() || ud_init {
                s.port = port;
            }
            if s.qp.cfg.state == QpState::Err {
                // Moving to ERR flushes outstanding work (ibv_modify_qp).
                s.qp.flush(&mut s.scq);
                s.qp.flush_recv(&mut s.rcq);
            }
        });
        self.mark_ready(i);
        self.touched(i);
        r
    }

    /// Changes a QP's congestion control: `kind` (a different kind starts a fresh controller
    /// at the line rate) and the DCQCN settings (a DCQCN QP's rate and alpha carry on).
    pub fn set_cc(
        &mut self,
        qpn: u32,
        kind: Option<CcKind>,
        params: DcqcnParams,
    ) -> Result<(), DeviceError> {
        let line = self.line_bps;
        let (i, s) = self.slot_of(qpn)?;
        match kind {
            Some(k) if k != s.qp.cc().kind() => s.qp.set_congestion_control(k, line, params),
            _ => s.qp.set_cc_params(params),
        }
        self.mark_ready(i);
        Ok(())
    }

    /// A QP's attributes and counters; None if there is no such QP.
    pub fn query(&self, qpn: u32, now: Instant) -> Option<QpQuery> {
        let s = self.slots[self.index(qpn)?].as_ref()?;
        let cc = s.qp.cc();
        Some(QpQuery {
            pd: s.qp.pd.0,
            cqs: s.bound.map(|b| b.map(|c| self.qpn(c))),
            cfg: s.qp.cfg,
            counters: s.qp.counters,
            port: s.port,
            caps: s.qp.caps(),
            cc_params: *s.qp.cc_params(),
            cc_kind: cc.kind().name(),
            rate_bps: cc.rate(),
            dcqcn: match cc {
                Cc::Dcqcn(d) => Some((d.target(), d.alpha(now, s.qp.cc_params()))),
                Cc::None { .. } => None,
            },
        })
    }

    /// Every QP's attributes and counters, by QPN (one call for a whole listing).
    pub fn query_all(&self, now: Instant) -> Vec<(u32, QpQuery)> {
        self.slots()
            .filter_map(|(_, s)| self.query(s.qp.qpn, now).map(|q| (s.qp.qpn, q)))
            .collect()
    }

    /// Posts a send work request: the one entry point. `inline` is its payload when the
    /// caller has the bytes (an application's ring entry carries them); a request flagged
    /// inline without them has its bytes gathered now from its SG list.
    pub fn post_send(
        &mut self,
        qpn: u32,
        wr: &SendWr,
        inline: Option<&[u8]>,
        now: Instant,
    ) -> Result<(), DeviceError> {
        let i = self.index(qpn).ok_or(DeviceError::NoQp(qpn))?;
        self.send_queue(i, now)
            .expect("looked up above")
            .post(wr, inline)
    }

    /// QP `slot`'s send queue held for a run of posts (None: no QP there): looked up once, its
    /// clock moved to `now` once, put on the ready list once, when the handle goes. What an
    /// application's ring is drained through: a post through it costs no lookup.
    pub fn send_queue(&mut self, slot: usize, now: Instant) -> Option<SendQueue<'_>> {
        let s = self.slots.get_mut(slot)?.as_mut()?;
        s.qp.observe(now);
        Some(SendQueue {
            s,
            mrs: &self.mrs,
            ready: &mut self.ready,
            slot: slot as u32,
            posted: false,
        })
    }

    /// Posts a receive work request.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), DeviceError> {
        let (i, s) = self.slot_of(qpn)?;
        let r = s.qp.post_recv(wr);
        // Ready, so that a receive posted in ERR is flushed on the next poll.
        self.mark_ready(i);
        Ok(r?)
    }

    /// Gives QP `qpn`'s completions to whoever drives it (an application's rings, a test)
    /// instead of its CQs: they wait in the QP's own queues for [`Device::take_completions`].
    pub fn claim_qp(&mut self, qpn: u32, c: Claim) -> Result<(), DeviceError> {
        let (i, _) = self.slot_of(qpn)?;
        self.claim(i, c);
        Ok(())
    }

    /// Hands QP `qpn`'s own send (`send`) or receive completions, oldest first, to `f` while
    /// it takes them (returns true); a completion it refuses stays, first in line. Allocates
    /// nothing. How many were taken.
    pub fn take_completions(
        &mut self,
        qpn: u32,
        send: bool,
        f: impl FnMut(&WorkCompletion) -> bool,
    ) -> Result<usize, DeviceError> {
        let (_, s) = self.slot_of(qpn)?;
        let cq = if send { &mut s.scq } else { &mut s.rcq };
        Ok(cq.take_while(f))
    }

    /// Takes up to `max` completions from a QP's own send and receive CQs (a side bound to a
    /// created CQ has none: poll that CQ); send completions, then receive completions.
    pub fn poll_cq(&mut self, qpn: u32, max: usize) -> (Vec<WorkCompletion>, Vec<WorkCompletion>) {
        let (mut sc, mut rc) = (Vec::new(), Vec::new());
        if let Ok((_, s)) = self.slot_of(qpn) {
            s.scq.poll(max, &mut sc);
            s.rcq.poll(max, &mut rc);
        }
        (sc, rc)
    }

    /// A copy of the completion-latency histograms (since the shard started).
    pub fn latencies(&self) -> LatencyHistograms {
        self.latency.clone()
    }

    /// The QPs' counters (destroyed QPs included), states and DCQCN at `now`.
    pub fn counters(&self, now: Instant) -> DeviceCounters {
        let mut qp = self.retired;
        let mut qp_states = [0u32; 7];
        let mut dcqcn = DcqcnSummary::default();
        for (_, s) in self.slots() {
            qp.add(&s.qp.counters);
            let st = s.qp.cfg.state;
            if let Some(k) = QpState::ALL.iter().position(|x| *x == st) {
                qp_states[k] += 1;
            }
            if let Cc::Dcqcn(d) = s.qp.cc() {
                let r = d.rate();
                dcqcn.min_rate_bps = if dcqcn.qps == 0 {
                    r
                } else {
                    dcqcn.min_rate_bps.min(r)
                };
                dcqcn.qps += 1;
                dcqcn.limited += (r < self.line_bps) as u32;
                dcqcn.sum_rate_bps += r;
                dcqcn.max_alpha = dcqcn.max_alpha.max(d.alpha(now, s.qp.cc_params()));
            }
        }
        DeviceCounters {
            qp,
            qp_states,
            dcqcn,
        }
    }
}

/// A QP's send queue, held for a run of posts ([`Device::send_queue`]).
pub struct SendQueue<'a> {
    s: &'a mut super::Slot,
    mrs: &'a crate::mr::MrTable,
    ready: &'a mut std::collections::VecDeque<u32>,
    slot: u32,
    posted: bool,
}

impl core::fmt::Debug for SendQueue<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SendQueue")
            .field("slot", &self.slot)
            .field("posted", &self.posted)
            .finish()
    }
}

impl SendQueue<'_> {
    /// Posts a send work request to this QP ([`Device::post_send`]).
    #[inline]
    pub fn post(&mut self, wr: &SendWr, inline: Option<&[u8]>) -> Result<(), DeviceError> {
        if inline.is_none() && wr.inline {
            return self.post_gathered(wr);
        }
        self.posted = true;
        Ok(self.s.qp.post_send(wr, wr.wr_id, inline)?)
    }

    /// [`SendQueue::post`] of an inline request without its bytes: gathered now from its SG
    /// list. Apart, so that the 512 bytes it gathers into are no part of every post's frame.
    #[cold]
    #[inline(never)]
    fn post_gathered(&mut self, wr: &SendWr) -> Result<(), DeviceError> {
        let gathered = crate::wr::inline_bytes(self.mrs, self.s.qp.pd, wr)?;
        self.posted = true;
        Ok(self.s.qp.post_send(wr, wr.wr_id, gathered.as_deref())?)
    }

    /// The QP's state.
    pub fn state(&self) -> QpState {
        self.s.qp.cfg.state
    }
}

impl Drop for SendQueue<'_> {
    /// Ready, if anything was posted (refused posts too, as [`Device::post_send`] does).
    fn drop(&mut self) {
        if self.posted && !self.s.ready {
            self.s.ready = true;
            self.ready.push_back(self.slot);
        }
    }
}
