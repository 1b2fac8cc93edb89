//! The communication manager (IBTA Vol. 1 chapter 12), sans-IO: one port's CM state machine for
//! both roles, on the MADs of QP1.
//!
//! Inputs: MADs received on QP1 with the address they came from ([`Cm::handle_mad`]), the
//! consumer's commands (listen, connect, accept, reject, establish, disconnect) and the time
//! ([`Cm::handle_timeout`]). Outputs: MADs to send ([`Cm::poll_transmit`]), events for the
//! consumer ([`Cm::poll_event`]) and the next deadline ([`Cm::poll_timeout`]), in quinn's
//! manner. The engine never touches a QP: a [`Event::Request`] or [`Event::Reply`] carries the
//! REQ or REP whose attributes the consumer moves its QP INIT -> RTR -> RTS with, as rdma_cm's
//! `init_qp_attr` does, and then answers with [`Cm::accept`] or [`Cm::establish`].
//!
//! The handshake and its timers:
//! - active: `connect` sends a REQ (REQ_SENT) and waits the passive side's response timeout
//!   (the REQ's "remote CM response timeout", 4.096 us * 2^n) plus two packet lifetimes, then
//!   sends it again, up to its max CM retries; then it sends a REJ (timeout) and reports
//!   [`Event::Unreachable`]. An MRA moves the wait to the MRA's service timeout. A REP gives
//!   [`Event::Reply`] (REP_RCVD); `establish` sends the RTU (ESTABLISHED).
//! - passive: a REQ for a listened service ID gives [`Event::Request`] (REQ_RCVD); a REQ for
//!   none is refused with REJ "invalid service ID" as Linux does. `accept` sends the REP
//!   (REP_SENT), resent after the active side's response timeout up to the REQ's max CM
//!   retries; the RTU makes it ESTABLISHED.
//! - duplicates are answered, never taken twice: a REQ again while the consumer thinks gives an
//!   MRA (what rdma_cm holds back for this case), after `accept` the REP again; a REP again once
//!   established the RTU again; a DREQ again in TIMEWAIT the DREP again.
//! - disconnect: DREQ (resent like a REQ, then given up) and DREP; either way the connection
//!   waits out TIMEWAIT (stray packets of the old connection die) before [`Event::TimewaitExit`]
//!   says its QP may be reused. A DREQ for a connection we do not know is answered with a DREP
//!   (the other side lost our DREP); a REP for one we never asked for gets a REJ "invalid
//!   communication ID".
//! - SIDR: a SIDR_REQ for a listened service gives [`Event::SidrRequest`], answered by
//!   `sidr_reply`; for none, a SIDR_REP "service ID not supported". `sidr_resolve` asks, with
//!   the REQ's timers, and reports [`Event::SidrResolved`] or [`Event::SidrUnreachable`].
//!
//! State is bounded: `max_conns` connection slots made at creation, and fixed-capacity queues
//! of MADs and events (past them a MAD is dropped and counted: the peer's retransmission
//! recovers it). When every slot is taken, a new REQ takes the slot of the oldest half-open
//! passive connection (REQ_RCVD, MRA_REQ_SENT or REP_SENT), counted; with none, it is refused
//! with REJ "no resources". Nothing here allocates after [`Cm::new`].
//!
//! A communication ID names its slot in its low 16 bits and the slot's generation in its high
//! 16, so a message for an older occupant of the slot is told apart.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;
use wire::cm::{
    self, Dreq, Ids, Message, Mra, MsgKind, Path, Rej, RejReason, Rep, Req, SidrRep, SidrReq,
    SidrStatus,
};
use wire::mad::MAD_LEN;
use wire::time::Instant;

pub mod ops;
#[cfg(test)]
mod tests;

/// One connection (or SIDR request) of this port: its local communication ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// Where a connection is (IBTA 12.9's states, as Linux names them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Active: the passive side sent an MRA; waiting longer.
    MraReqRcvd,
    /// Active: REP received; the consumer readies its QP and calls `establish`.
    RepRcvd,
    /// Passive: REQ received; the consumer decides.
    ReqRcvd,
    /// Passive: REQ received again while the consumer decides; MRA sent.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// Disconnected; stray packets of the connection die out.
    Timewait,
    /// Active SIDR: SIDR_REQ sent.
    SidrReqSent,
    /// Passive SIDR: SIDR_REQ received; the consumer decides.
    SidrReqRcvd,
}

impl State {
    /// The state's name.
    pub fn name(self) -> &'static str {
        match self {
            State::ReqSent => "REQ_SENT",
            State::MraReqRcvd => "MRA_REQ_RCVD",
            State::RepRcvd => "REP_RCVD",
            State::ReqRcvd => "REQ_RCVD",
            State::MraReqSent => "MRA_REQ_SENT",
            State::RepSent => "REP_SENT",
            State::Established => "ESTABLISHED",
            State::DreqSent => "DREQ_SENT",
            State::Timewait => "TIMEWAIT",
            State::SidrReqSent => "SIDR_REQ_SENT",
            State::SidrReqRcvd => "SIDR_REQ_RCVD",
        }
    }
    fn half_open_passive(self) -> bool {
        matches!(self, State::ReqRcvd | State::MraReqSent | State::RepSent)
    }
}

/// How the engine behaves.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// This port's CA GUID (in REQs and REPs).
    pub local_ca_guid: u64,
    /// Connection slots (at most 65,536).
    pub max_conns: usize,
    /// Service IDs that can be listened on at once.
    pub max_listens: usize,
    /// MADs and events that can wait to be polled.
    pub queue: usize,
    /// The network's packet lifetime: every wait adds two.
    pub packet_life: Duration,
    /// How long our consumer takes to answer, as IBTA's 5-bit code (4.096 us * 2^n): our REQs'
    /// "local CM response timeout".
    pub response_timeout: u8,
    /// What we ask of the other side's consumer: our REQs' "remote CM response timeout".
    pub remote_response_timeout: u8,
    /// How often a REQ, REP, DREQ or SIDR_REQ is sent again before giving up (4 bits).
    pub max_cm_retries: u8,
    /// The service timeout an MRA announces (5 bits; rdma_cm's 24, about 69 s).
    pub mra_service_timeout: u8,
    /// How long a disconnected connection waits before its slot and QP are free.
    pub timewait: Duration,
    /// Randomness for communication IDs and transaction IDs (given, as time is).
    pub seed: u64,
    /// How long a REQ or SIDR_REQ for a service nobody listens on waits for a listener before
    /// it is refused (zero: at once, as Linux's ib_cm). A consumer whose listen takes longer
    /// than a system call (an application attached to roced) sets it, so that a peer that
    /// connects right behind the message saying "I am about to listen" is not refused.
    pub listen_grace: Duration,
    /// Requests that may wait for a listener at once; past it they are refused at once.
    pub max_orphans: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            local_ca_guid: 0,
            max_conns: 1024,
            max_listens: 64,
            queue: 256,
            packet_life: Duration::from_millis(1),
            response_timeout: 20,
            remote_response_timeout: 20,
            max_cm_retries: 15,
            mra_service_timeout: 24,
            timewait: Duration::from_secs(1),
            seed: 0x5eed,
            listen_grace: Duration::ZERO,
            max_orphans: 64,
        }
    }
}

/// 4.096 us * 2^code: IBTA's timeout encoding (codes past 31 are taken as 31).
pub fn timeout_of(code: u8) -> Duration {
    Duration::from_nanos(4096u64 << code.min(31))
}

/// What the active side asks for.
#[derive(Clone, Copy, Debug)]
pub struct ConnectParams {
    /// The service to connect to.
    pub service_id: u64,
    /// The passive side's address (its GID as an IP address).
    pub peer: IpAddr,
    /// The path: GIDs, traffic class, hop limit, flow label, ACK timeout.
    pub path: Path,
    /// Our QP.
    pub qpn: u32,
    /// Our QP's first send PSN.
    pub starting_psn: u32,
    /// Path MTU (IBTA code).
    pub path_mtu: u8,
    /// READs and atomics we take at once.
    pub responder_resources: u8,
    /// READs and atomics we issue at once.
    pub initiator_depth: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits).
    pub rnr_retry_count: u8,
    /// Our QP takes receives from an SRQ.
    pub srq: bool,
    /// P_Key.
    pub pkey: u16,
    /// Private data (rdma_cm's header and the application's).
    pub private_data: [u8; cm::private_len::REQ],
}

impl ConnectParams {
    /// An RC connect of QP `qpn` from `starting_psn` to `service_id` at `peer` over `path`,
    /// with what rdma_cm asks by default: path MTU 1024, one READ or atomic outstanding each
    /// way, 7 transport and RNR retries (RNR: infinite), P_Key 0xFFFF, no SRQ, no private data.
    pub fn new(service_id: u64, peer: IpAddr, path: Path, qpn: u32, starting_psn: u32) -> Self {
        ConnectParams {
            service_id,
            peer,
            path,
            qpn,
            starting_psn,
            path_mtu: 3,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            pkey: 0xffff,
            private_data: [0; cm::private_len::REQ],
        }
    }
}

/// What the passive side answers with.
#[derive(Clone, Copy, Debug)]
pub struct AcceptParams {
    /// Our QP.
    pub qpn: u32,
    /// Our QP's first send PSN.
    pub starting_psn: u32,
    /// READs and atomics we take at once.
    pub responder_resources: u8,
    /// READs and atomics we issue at once.
    pub initiator_depth: u8,
    /// Our ACK delay (5-bit code).
    pub target_ack_delay: u8,
    /// RNR retries the active side may use.
    pub rnr_retry_count: u8,
    /// Our QP takes receives from an SRQ.
    pub srq: bool,
    /// Private data.
    pub private_data: [u8; cm::private_len::REP],
}

impl AcceptParams {
    /// An answer with QP `qpn` from `starting_psn`: one READ or atomic outstanding each way,
    /// an ACK delay code of 15 (134 ms), 7 RNR retries, no SRQ, no private data.
    pub fn new(qpn: u32, starting_psn: u32) -> Self {
        AcceptParams {
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: 15,
            rnr_retry_count: 7,
            srq: false,
            private_data: [0; cm::private_len::REP],
        }
    }
}

/// What the consumer is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Passive: a REQ for a listened service. Ready a QP with its attributes, then `accept` (or
    /// `reject`).
    Request {
        /// The new connection.
        conn: ConnId,
        /// Where it came from.
        peer: IpAddr,
        /// The REQ.
        req: Req,
    },
    /// Active: the REP. Move the QP to RTR and RTS with it, then `establish` (or `reject`).
    Reply {
        /// The connection.
        conn: ConnId,
        /// The REP.
        rep: Rep,
    },
    /// The connection is up (active: RTU sent; passive: RTU received).
    Established {
        /// The connection.
        conn: ConnId,
    },
    /// The other side refused.
    Rejected {
        /// The connection (now gone).
        conn: ConnId,
        /// Why.
        reason: RejReason,
    },
    /// The other side never answered (every retry spent); a REJ "timeout" was sent.
    Unreachable {
        /// The connection (now gone).
        conn: ConnId,
    },
    /// The connection is down (DREQ received, or ours answered or given up); it waits in
    /// TIMEWAIT.
    Disconnected {
        /// The connection.
        conn: ConnId,
    },
    /// TIMEWAIT is over: the connection is gone and its QP may be reused.
    TimewaitExit {
        /// The connection.
        conn: ConnId,
    },
    /// Passive: a half-open connection was dropped to make room for a new REQ (every slot
    /// taken); the other side will time out.
    Evicted {
        /// The connection (now gone).
        conn: ConnId,
    },
    /// Passive SIDR: which UD QP serves this service? Answer with `sidr_reply`.
    SidrRequest {
        /// The request.
        conn: ConnId,
        /// Where it came from.
        peer: IpAddr,
        /// The SIDR_REQ.
        req: SidrReq,
    },
    /// Active SIDR: the answer.
    SidrResolved {
        /// The request (now gone).
        conn: ConnId,
        /// The SIDR_REP (status, QPN, Q_Key).
        rep: SidrRep,
    },
    /// Active SIDR: no answer after every retry.
    SidrUnreachable {
        /// The request (now gone).
        conn: ConnId,
    },
}

/// A MAD to send to QP1 of `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The destination's address (its GID as an IP address).
    pub to: IpAddr,
    /// The MAD.
    pub mad: [u8; MAD_LEN],
}

/// Why a command was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No such connection.
    #[error("no such connection")]
    NoConn,
    /// The connection is not in a state that takes this command.
    #[error("connection is {0}")]
    WrongState(&'static str),
    /// Every connection slot is taken.
    #[error("no free connection slot")]
    NoSlot,
    /// The service ID is listened on already.
    #[error("service ID already listened on")]
    Listening,
    /// Every listen slot is taken.
    #[error("too many listens")]
    TooManyListens,
    /// More private data than the message holds.
    #[error("private data longer than the message's {0} bytes")]
    PrivateDataTooLong(usize),
}

/// What the engine counted (single writer: the lcore that owns the port).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// MADs received (any).
    pub rx: u64,
    /// MADs sent (queued for sending).
    pub tx: u64,
    /// Received MADs that are not CM messages (truncated, other class, bad version, method or
    /// attribute), dropped.
    pub rx_malformed: u64,
    /// Messages for no connection we know (RTU, MRA, REJ, DREP, SIDR_REP with a stale or
    /// unknown ID), dropped.
    pub rx_unknown_conn: u64,
    /// Messages that do not fit the connection's state (a REP to a passive connection, say),
    /// dropped.
    pub rx_unexpected: u64,
    /// Retransmitted messages received and answered again (or ignored as already handled).
    pub rx_duplicate: u64,
    /// REJs sent.
    pub tx_rej: u64,
    /// Our messages sent again after a timeout.
    pub retransmits: u64,
    /// Connections given up after every retry.
    pub timeouts: u64,
    /// Half-open passive connections dropped to make room for a new REQ.
    pub evicted: u64,
    /// MADs or events dropped because the queue was full.
    pub queue_full: u64,
    /// Connections established.
    pub established: u64,
}

impl Counters {
    /// Each counter with its name (the metric is `ferroce_cm_<name>_total`).
    pub fn named(&self) -> [(&'static str, u64); 12] {
        [
            ("rx_mads", self.rx),
            ("tx_mads", self.tx),
            ("rx_malformed", self.rx_malformed),
            ("rx_unknown_conn", self.rx_unknown_conn),
            ("rx_unexpected", self.rx_unexpected),
            ("rx_duplicate", self.rx_duplicate),
            ("tx_rej", self.tx_rej),
            ("retransmits", self.retransmits),
            ("timeouts", self.timeouts),
            ("evicted", self.evicted),
            ("queue_full", self.queue_full),
            ("established", self.established),
        ]
    }
}

#[derive(Clone, Copy, Debug)]
struct Conn {
    id: u32,
    state: State,
    peer: IpAddr,
    /// The other side's communication ID (0 until known).
    remote_id: u32,
    /// The other side's QPN (for DREQs).
    remote_qpn: u32,
    /// The TID of the exchange in progress (echoed by answers).
    tid: u64,
    /// The last message we sent that a timeout resends, or an answer we give again to a
    /// duplicate.
    last: [u8; MAD_LEN],
    deadline: Option<Instant>,
    retries_left: u8,
    /// The other side's response timeout code.
    peer_timeout: u8,
    /// Retries the other side allows.
    max_retries: u8,
    /// When the slot was taken (eviction picks the oldest).
    born: Instant,
    /// A SIDR request rather than a connection.
    sidr: bool,
    /// The service ID (passive SIDR: for the answer).
    service_id: u64,
}

/// A request for a service nobody listens on yet, waiting [`Config::listen_grace`].
#[derive(Clone, Copy, Debug)]
struct Orphan {
    /// When it came.
    at: Instant,
    /// When it is refused (its arrival, once a listener comes: taken at the next timeout).
    deadline: Instant,
    from: IpAddr,
    tid: u64,
    req: OrphanReq,
}

#[derive(Clone, Copy, Debug)]
enum OrphanReq {
    Req(Req),
    Sidr(SidrReq),
}

impl Orphan {
    fn service_id(&self) -> u64 {
        match &self.req {
            OrphanReq::Req(r) => r.service_id,
            OrphanReq::Sidr(r) => r.service_id,
        }
    }

    /// The same request again (a retransmission): the same peer and its ID.
    fn is(&self, from: IpAddr, remote: u32, sidr: bool) -> bool {
        self.from == from
            && match &self.req {
                OrphanReq::Req(r) => !sidr && r.local_comm_id == remote,
                OrphanReq::Sidr(r) => sidr && r.request_id == remote,
            }
    }
}

/// One port's communication manager.
#[derive(Debug)]
pub struct Cm {
    cfg: Config,
    slots: Vec<Option<Conn>>,
    /// Each slot's generation: the high 16 bits of its next communication ID.
    gens: Vec<u16>,
    listens: Vec<u64>,
    /// Requests waiting for a listener, oldest first.
    orphans: VecDeque<Orphan>,
    tx: VecDeque<Transmit>,
    events: VecDeque<Event>,
    next_tid: u64,
    counters: Counters,
}

impl Cm {
    /// Names the CA in the REQs, REPs and REJs it sends from now on (its node GUID, which
    /// peers pair with our communication IDs to tell one CA's connections from another's).
    pub fn set_local_ca_guid(&mut self, guid: u64) {
        self.cfg.local_ca_guid = guid;
    }

    /// A CM with every slot and queue made.
    pub fn new(cfg: Config) -> Cm {
        let n = cfg.max_conns.clamp(1, 1 << 16);
        let mut x = cfg.seed | 1;
        let gens = (0..n)
            .map(|_| {
                // xorshift: different generations per slot, from the seed.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u16
            })
            .collect();
        Cm {
            slots: vec![None; n],
            gens,
            listens: Vec::with_capacity(cfg.max_listens),
            orphans: VecDeque::with_capacity(cfg.max_orphans.min(1024)),
            tx: VecDeque::with_capacity(cfg.queue),
            events: VecDeque::with_capacity(cfg.queue),
            next_tid: cfg.seed.rotate_left(32) & 0x0000_ffff_ffff_0000,
            counters: Counters::default(),
            cfg,
        }
    }

    /// What was counted.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// A connection's state and peer.
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.get(conn.0).map(|c| c.state)
    }

    /// Every connection: ID, state, peer, the other side's communication ID.
    pub fn conns(&self) -> impl Iterator<Item = (ConnId, State, IpAddr, u32)> + '_ {
        self.slots
            .iter()
            .flatten()
            .map(|c| (ConnId(c.id), c.state, c.peer, c.remote_id))
    }

    /// Listens on a service ID (REQs and SIDR_REQs for it are taken).
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listens.contains(&service_id) {
            return Err(CmError::Listening);
        }
        if self.listens.len() >= self.cfg.max_listens {
            return Err(CmError::TooManyListens);
        }
        self.listens.push(service_id);
        // Requests that came for it just before are taken at the next timeout.
        for o in self.orphans.iter_mut() {
            if o.service_id() == service_id {
                o.deadline = o.at;
            }
        }
        Ok(())
    }

    /// Stops listening; connections made through it stay.
    pub fn unlisten(&mut self, service_id: u64) -> bool {
        let before = self.listens.len();
        self.listens.retain(|s| *s != service_id);
        self.listens.len() != before
    }

    /// Active: sends a REQ.
    pub fn connect(&mut self, now: Instant, p: &ConnectParams) -> Result<ConnId, CmError> {
        let slot = self.free_slot().ok_or(CmError::NoSlot)?;
        let id = self.id_for(slot);
        let tid = self.new_tid();
        let req = Req {
            local_comm_id: id,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: self.cfg.local_ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn & 0xff_ffff,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.cfg.remote_response_timeout,
            transport: 0,
            end_to_end_flow_control: false,
            starting_psn: p.starting_psn & 0xff_ffff,
            local_cm_response_timeout: self.cfg.response_timeout,
            retry_count: p.retry_count,
            pkey: p.pkey,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: self.cfg.max_cm_retries,
            srq: p.srq,
            extended_transport: 0,
            primary: p.path,
            alternate: Path::default(),
            sap_supported: false,
            private_data: p.private_data,
        };
        let wait = self.wait(self.cfg.remote_response_timeout);
        let mut c = Conn::new(id, State::ReqSent, p.peer, tid, now);
        c.peer_timeout = self.cfg.remote_response_timeout;
        c.max_retries = self.cfg.max_cm_retries;
        self.slots[slot] = Some(c);
        self.send_timed(slot, Message::Req(req), tid, now, wait);
        Ok(ConnId(id))
    }

    /// Passive: answers a [`Event::Request`] with a REP.
    pub fn accept(&mut self, now: Instant, conn: ConnId, p: &AcceptParams) -> Result<(), CmError> {
        let slot = self.slot_of(conn, &[State::ReqRcvd, State::MraReqSent])?;
        let c = self.slots[slot].as_ref().expect("slot_of found it");
        let rep = Rep {
            local_comm_id: c.id,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.qpn & 0xff_ffff,
            local_eecn: 0,
            starting_psn: p.starting_psn & 0xff_ffff,
            vendor_id: 0,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: 1,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: self.cfg.local_ca_guid,
            private_data: p.private_data,
        };
        let (tid, wait) = (c.tid, self.wait(c.peer_timeout));
        self.set_state(slot, State::RepSent);
        self.send_timed(slot, Message::Rep(rep), tid, now, wait);
        Ok(())
    }

    /// Refuses a connection the consumer was asked about (a REQ, or a REP it cannot use), or
    /// withdraws a REQ of ours still unanswered (as Linux's `ib_destroy_cm_id` does in
    /// REQ_SENT: a REJ for reason timeout whatever `reason` says, naming no message, our CA
    /// GUID in its ARI; the REQ's retransmissions stopped).
    pub fn reject(
        &mut self,
        conn: ConnId,
        reason: RejReason,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let slot = self.slot_of(
            conn,
            &[
                State::ReqRcvd,
                State::MraReqSent,
                State::RepRcvd,
                State::ReqSent,
                State::MraReqRcvd,
            ],
        )?;
        if private_data.len() > cm::private_len::REJ {
            return Err(CmError::PrivateDataTooLong(cm::private_len::REJ));
        }
        let c = self.slots[slot].expect("slot_of found it");
        if matches!(c.state, State::ReqSent | State::MraReqRcvd) {
            // The peer knows the connection only by our ID: a withdrawal says "timeout" with
            // our CA GUID in the ARI, which is how the passive side (Linux's
            // cm_acquire_rejected_id, and ours) finds it by the remote's IDs.
            let mut pd = [0u8; cm::private_len::REJ];
            pd[..private_data.len()].copy_from_slice(private_data);
            let mut ari = [0u8; cm::ARI_LEN];
            ari[..8].copy_from_slice(&self.cfg.local_ca_guid.to_be_bytes());
            let rej = Message::Rej(Rej {
                local_comm_id: c.id,
                remote_comm_id: c.remote_id,
                message_rejected: MsgKind::Other,
                ari_len: 8,
                reason: RejReason::Timeout,
                ari,
                private_data: pd,
            });
            self.counters.tx_rej += 1;
            self.emit_to(c.peer, rej, c.tid);
        } else {
            let kind = match c.state {
                State::RepRcvd => MsgKind::Rep,
                _ => MsgKind::Req,
            };
            self.send_rej(c.peer, c.tid, c.id, c.remote_id, kind, reason, private_data);
        }
        self.slots[slot] = None;
        Ok(())
    }

    /// Active: the QP is ready; sends the RTU.
    pub fn establish(&mut self, conn: ConnId) -> Result<(), CmError> {
        let slot = self.slot_of(conn, &[State::RepRcvd])?;
        let c = self.slots[slot].expect("slot_of found it");
        let rtu = Message::Rtu(Ids {
            local_comm_id: c.id,
            remote_comm_id: c.remote_id,
            private_data: [0; cm::private_len::RTU],
        });
        self.set_state(slot, State::Established);
        self.send_untimed(slot, rtu, c.tid);
        self.counters.established += 1;
        self.event(Event::Established { conn });
        Ok(())
    }

    /// Sends a DREQ for an established connection.
    pub fn disconnect(&mut self, now: Instant, conn: ConnId) -> Result<(), CmError> {
        let slot = self.slot_of(conn, &[State::Established])?;
        let c = self.slots[slot].expect("slot_of found it");
        let tid = self.new_tid();
        let dreq = Message::Dreq(Dreq {
            local_comm_id: c.id,
            remote_comm_id: c.remote_id,
            remote_qpn: c.remote_qpn,
            private_data: [0; cm::private_len::DREQ],
        });
        let wait = self.wait(c.peer_timeout);
        if let Some(c) = self.slots[slot].as_mut() {
            c.tid = tid;
            c.retries_left = c.max_retries;
        }
        self.set_state(slot, State::DreqSent);
        self.send_timed(slot, dreq, tid, now, wait);
        Ok(())
    }

    /// Active SIDR: asks `peer` which UD QP serves `service_id`.
    pub fn sidr_resolve(
        &mut self,
        now: Instant,
        peer: IpAddr,
        service_id: u64,
        pkey: u16,
        private_data: &[u8; cm::private_len::SIDR_REQ],
    ) -> Result<ConnId, CmError> {
        let slot = self.free_slot().ok_or(CmError::NoSlot)?;
        let id = self.id_for(slot);
        let tid = self.new_tid();
        let mut c = Conn::new(id, State::SidrReqSent, peer, tid, now);
        c.sidr = true;
        c.service_id = service_id;
        c.max_retries = self.cfg.max_cm_retries;
        c.peer_timeout = self.cfg.remote_response_timeout;
        self.slots[slot] = Some(c);
        let req = Message::SidrReq(SidrReq {
            request_id: id,
            pkey,
            service_id,
            private_data: *private_data,
        });
        let wait = self.wait(self.cfg.remote_response_timeout);
        self.send_timed(slot, req, tid, now, wait);
        Ok(ConnId(id))
    }

    /// Passive SIDR: answers a [`Event::SidrRequest`]. The answer is kept for TIMEWAIT, so a
    /// retransmitted SIDR_REQ gets it again.
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        conn: ConnId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
    ) -> Result<(), CmError> {
        let slot = self.slot_of(conn, &[State::SidrReqRcvd])?;
        let c = self.slots[slot].expect("slot_of found it");
        let rep = self.sidr_rep(c.remote_id, c.service_id, status, qpn & 0xff_ffff, qkey);
        self.send_untimed(slot, rep, c.tid);
        self.enter_timewait(slot, now);
        Ok(())
    }

    /// A MAD received on QP1 from `from`.
    pub fn handle_mad(&mut self, now: Instant, from: IpAddr, mad: &[u8]) {
        self.counters.rx += 1;
        let Ok((hdr, msg)) = Message::parse(mad) else {
            self.counters.rx_malformed += 1;
            return;
        };
        let tid = hdr.tid;
        match msg {
            Message::Req(r) => self.on_req(now, from, tid, &r),
            Message::Mra(m) => self.on_mra(now, &m),
            Message::Rej(r) => self.on_rej(from, &r),
            Message::Rep(r) => self.on_rep(from, tid, &r),
            Message::Rtu(r) => self.on_rtu(&r),
            Message::Dreq(d) => self.on_dreq(now, from, tid, &d),
            Message::Drep(r) => self.on_drep(now, &r),
            Message::SidrReq(r) => self.on_sidr_req(now, from, tid, &r),
            Message::SidrRep(r) => self.on_sidr_rep(&r),
        }
    }

    /// The earliest deadline of any connection.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let orphans = self.orphans.iter().map(|o| o.deadline).min();
        self.slots
            .iter()
            .flatten()
            .filter_map(|c| c.deadline)
            .chain(orphans)
            .min()
    }

    /// Requests that waited for a listener: taken if one came, refused once their wait is
    /// over.
    fn handle_orphans(&mut self, now: Instant) {
        if self.orphans.iter().all(|o| o.deadline > now) {
            return;
        }
        // In place, oldest first, those not due going round to the back (no allocation on
        // the lcore; taking a due one never makes another orphan: its service is listened
        // on, or it is refused).
        for _ in 0..self.orphans.len() {
            let Some(o) = self.orphans.pop_front() else {
                break;
            };
            if o.deadline > now {
                self.orphans.push_back(o);
                continue;
            }
            let listened = self.listens.contains(&o.service_id());
            match o.req {
                OrphanReq::Req(r) if listened => self.on_req(now, o.from, o.tid, &r),
                OrphanReq::Sidr(r) if listened => self.on_sidr_req(now, o.from, o.tid, &r),
                OrphanReq::Req(r) => self.send_rej(
                    o.from,
                    o.tid,
                    0,
                    r.local_comm_id,
                    MsgKind::Req,
                    RejReason::InvalidServiceId,
                    &[],
                ),
                OrphanReq::Sidr(r) => {
                    let rep =
                        self.sidr_rep(r.request_id, r.service_id, SidrStatus::NoServiceId, 0, 0);
                    self.emit_to(o.from, rep, o.tid);
                }
            }
        }
    }

    /// Keeps a request for a service nobody listens on for [`Config::listen_grace`]; false
    /// when it must be refused now (no grace, or no room).
    fn orphan(&mut self, now: Instant, from: IpAddr, tid: u64, req: OrphanReq) -> bool {
        let (remote, sidr) = match &req {
            OrphanReq::Req(r) => (r.local_comm_id, false),
            OrphanReq::Sidr(r) => (r.request_id, true),
        };
        if self.orphans.iter().any(|o| o.is(from, remote, sidr)) {
            self.counters.rx_duplicate += 1;
            return true;
        }
        if self.cfg.listen_grace.is_zero() || self.orphans.len() >= self.cfg.max_orphans {
            return false;
        }
        self.orphans.push_back(Orphan {
            at: now,
            deadline: now + self.cfg.listen_grace,
            from,
            tid,
            req,
        });
        true
    }

    /// Fires every deadline at or before `now`: resends, gives up, ends TIMEWAIT.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.handle_orphans(now);
        for slot in 0..self.slots.len() {
            let Some(c) = self.slots[slot] else { continue };
            if c.deadline.is_none_or(|d| d > now) {
                continue;
            }
            let conn = ConnId(c.id);
            match c.state {
                State::Timewait => {
                    self.slots[slot] = None;
                    if !c.sidr {
                        self.event(Event::TimewaitExit { conn });
                    }
                }
                State::ReqSent
                | State::MraReqRcvd
                | State::RepSent
                | State::DreqSent
                | State::SidrReqSent
                    if c.retries_left > 0 =>
                {
                    self.counters.retransmits += 1;
                    let wait = self.wait(c.peer_timeout);
                    let s = self.slots[slot].as_mut().expect("checked");
                    s.retries_left -= 1;
                    s.deadline = Some(now + wait);
                    let mad = s.last;
                    self.push_tx(c.peer, mad);
                }
                State::DreqSent => {
                    self.counters.timeouts += 1;
                    self.enter_timewait(slot, now);
                    self.event(Event::Disconnected { conn });
                }
                State::SidrReqSent => {
                    self.counters.timeouts += 1;
                    self.slots[slot] = None;
                    self.event(Event::SidrUnreachable { conn });
                }
                State::ReqSent | State::MraReqRcvd | State::RepSent => {
                    self.counters.timeouts += 1;
                    let kind = if c.state == State::RepSent {
                        MsgKind::Rep
                    } else {
                        MsgKind::Req
                    };
                    self.send_rej(
                        c.peer,
                        c.tid,
                        c.id,
                        c.remote_id,
                        kind,
                        RejReason::Timeout,
                        &[],
                    );
                    self.slots[slot] = None;
                    self.event(Event::Unreachable { conn });
                }
                _ => {
                    if let Some(s) = self.slots[slot].as_mut() {
                        s.deadline = None;
                    }
                }
            }
        }
    }

    /// Whether MADs wait to be sent.
    pub fn has_transmit(&self) -> bool {
        !self.tx.is_empty()
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }

    /// The next event for the consumer.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn on_req(&mut self, now: Instant, from: IpAddr, tid: u64, r: &Req) {
        // A retransmission: the same peer and communication ID.
        if let Some(slot) = self.find_remote(from, r.local_comm_id, false) {
            self.counters.rx_duplicate += 1;
            let c = self.slots[slot].expect("found");
            match c.state {
                State::ReqRcvd | State::MraReqSent => {
                    let mra = Message::Mra(Mra {
                        local_comm_id: c.id,
                        remote_comm_id: c.remote_id,
                        message_mraed: MsgKind::Req,
                        service_timeout: self.cfg.mra_service_timeout,
                        private_data: [0; cm::private_len::MRA],
                    });
                    self.set_state(slot, State::MraReqSent);
                    self.send_untimed(slot, mra, c.tid);
                }
                State::RepSent => self.push_tx(from, c.last),
                State::Timewait => self.send_rej(
                    from,
                    tid,
                    c.id,
                    r.local_comm_id,
                    MsgKind::Req,
                    RejReason::StaleConn,
                    &[],
                ),
                _ => {}
            }
            return;
        }
        if !self.listens.contains(&r.service_id) {
            if self.orphan(now, from, tid, OrphanReq::Req(*r)) {
                return;
            }
            self.send_rej(
                from,
                tid,
                0,
                r.local_comm_id,
                MsgKind::Req,
                RejReason::InvalidServiceId,
                &[],
            );
            return;
        }
        let slot = match self.free_slot() {
            Some(s) => s,
            None => match self.oldest_half_open() {
                Some(s) => {
                    self.counters.evicted += 1;
                    let old = self.slots[s].take().expect("half-open");
                    self.event(Event::Evicted {
                        conn: ConnId(old.id),
                    });
                    s
                }
                None => {
                    self.send_rej(
                        from,
                        tid,
                        0,
                        r.local_comm_id,
                        MsgKind::Req,
                        RejReason::NoResources,
                        &[],
                    );
                    return;
                }
            },
        };
        let id = self.id_for(slot);
        let mut c = Conn::new(id, State::ReqRcvd, from, tid, now);
        c.remote_id = r.local_comm_id;
        c.remote_qpn = r.local_qpn;
        c.peer_timeout = r.local_cm_response_timeout;
        c.max_retries = r.max_cm_retries;
        self.slots[slot] = Some(c);
        self.event(Event::Request {
            conn: ConnId(id),
            peer: from,
            req: *r,
        });
    }

    fn on_mra(&mut self, now: Instant, m: &Mra) {
        let Some(slot) = self.find_local(m.remote_comm_id) else {
            self.counters.rx_unknown_conn += 1;
            return;
        };
        let c = self.slots[slot].expect("found");
        match (c.state, m.message_mraed) {
            (State::ReqSent | State::MraReqRcvd, MsgKind::Req) => {
                let wait = self.wait(m.service_timeout);
                let s = self.slots[slot].as_mut().expect("found");
                s.state = State::MraReqRcvd;
                s.remote_id = m.local_comm_id;
                s.deadline = Some(now + wait);
            }
            _ => self.counters.rx_unexpected += 1,
        }
    }

    fn on_rej(&mut self, from: IpAddr, r: &Rej) {
        // A REQ withdrawn (reason timeout, sent before the peer learned our ID) names the
        // connection by the peer's own ID.
        let withdrawn = || {
            (r.reason == RejReason::Timeout)
                .then(|| self.find_remote(from, r.local_comm_id, false))
                .flatten()
        };
        let Some(slot) = self.find_local(r.remote_comm_id).or_else(withdrawn) else {
            self.counters.rx_unknown_conn += 1;
            return;
        };
        let c = self.slots[slot].expect("found");
        let refusable = matches!(
            c.state,
            State::ReqSent
                | State::MraReqRcvd
                | State::RepRcvd
                | State::ReqRcvd
                | State::MraReqSent
                | State::RepSent
        );
        if !refusable {
            self.counters.rx_unexpected += 1;
            return;
        }
        self.slots[slot] = None;
        self.event(Event::Rejected {
            conn: ConnId(c.id),
            reason: r.reason,
        });
    }

    fn on_rep(&mut self, from: IpAddr, tid: u64, r: &Rep) {
        let Some(slot) = self.find_local(r.remote_comm_id) else {
            // A REP for a connection we never asked for.
            self.counters.rx_unknown_conn += 1;
            self.send_rej(
                from,
                tid,
                0,
                r.local_comm_id,
                MsgKind::Rep,
                RejReason::InvalidCommId,
                &[],
            );
            return;
        };
        let c = self.slots[slot].expect("found");
        match c.state {
            State::ReqSent | State::MraReqRcvd => {
                let s = self.slots[slot].as_mut().expect("found");
                s.state = State::RepRcvd;
                s.remote_id = r.local_comm_id;
                s.remote_qpn = r.local_qpn;
                s.deadline = None;
                self.event(Event::Reply {
                    conn: ConnId(c.id),
                    rep: *r,
                });
            }
            State::RepRcvd => self.counters.rx_duplicate += 1,
            // Our RTU was lost: the passive side sent its REP again.
            State::Established if r.local_comm_id == c.remote_id => {
                self.counters.rx_duplicate += 1;
                self.push_tx(c.peer, c.last);
            }
            _ => self.counters.rx_unexpected += 1,
        }
    }

    fn on_rtu(&mut self, r: &Ids) {
        let Some(slot) = self.find_local(r.remote_comm_id) else {
            self.counters.rx_unknown_conn += 1;
            return;
        };
        let c = self.slots[slot].expect("found");
        match c.state {
            State::RepSent if r.local_comm_id == c.remote_id => {
                self.set_state(slot, State::Established);
                if let Some(s) = self.slots[slot].as_mut() {
                    s.deadline = None;
                }
                self.counters.established += 1;
                self.event(Event::Established { conn: ConnId(c.id) });
            }
            State::Established => self.counters.rx_duplicate += 1,
            _ => self.counters.rx_unexpected += 1,
        }
    }

    fn on_dreq(&mut self, now: Instant, from: IpAddr, tid: u64, d: &Dreq) {
        let drep = |local: u32| {
            Message::Drep(Ids {
                local_comm_id: local,
                remote_comm_id: d.local_comm_id,
                private_data: [0; cm::private_len::RTU],
            })
        };
        let Some(slot) = self
            .find_local(d.remote_comm_id)
            .filter(|&s| self.slots[s].is_some_and(|c| c.remote_id == d.local_comm_id))
        else {
            // Unknown (or long gone): answer, so the other side stops asking.
            self.counters.rx_unknown_conn += 1;
            self.emit_to(from, drep(d.remote_comm_id), tid);
            return;
        };
        let c = self.slots[slot].expect("found");
        match c.state {
            State::Established | State::DreqSent => {
                self.enter_timewait(slot, now);
                self.emit_to(from, drep(c.id), tid);
                self.event(Event::Disconnected { conn: ConnId(c.id) });
            }
            State::Timewait => {
                self.counters.rx_duplicate += 1;
                self.emit_to(from, drep(c.id), tid);
            }
            _ => self.counters.rx_unexpected += 1,
        }
    }

    fn on_drep(&mut self, now: Instant, r: &Ids) {
        let Some(slot) = self.find_local(r.remote_comm_id) else {
            self.counters.rx_unknown_conn += 1;
            return;
        };
        let c = self.slots[slot].expect("found");
        match c.state {
            State::DreqSent => {
                self.enter_timewait(slot, now);
                self.event(Event::Disconnected { conn: ConnId(c.id) });
            }
            State::Timewait => self.counters.rx_duplicate += 1,
            _ => self.counters.rx_unexpected += 1,
        }
    }

    fn on_sidr_req(&mut self, now: Instant, from: IpAddr, tid: u64, r: &SidrReq) {
        if let Some(slot) = self.find_remote(from, r.request_id, true) {
            // Answered already: the answer again; still deciding: nothing yet.
            self.counters.rx_duplicate += 1;
            let c = self.slots[slot].expect("found");
            if c.state == State::Timewait {
                self.push_tx(from, c.last);
            }
            return;
        }
        if !self.listens.contains(&r.service_id) {
            if self.orphan(now, from, tid, OrphanReq::Sidr(*r)) {
                return;
            }
            let rep = self.sidr_rep(r.request_id, r.service_id, SidrStatus::NoServiceId, 0, 0);
            self.emit_to(from, rep, tid);
            return;
        }
        let Some(slot) = self.free_slot() else {
            let rep = self.sidr_rep(r.request_id, r.service_id, SidrStatus::NoQp, 0, 0);
            self.emit_to(from, rep, tid);
            return;
        };
        let id = self.id_for(slot);
        let mut c = Conn::new(id, State::SidrReqRcvd, from, tid, now);
        c.sidr = true;
        c.service_id = r.service_id;
        c.remote_id = r.request_id;
        self.slots[slot] = Some(c);
        self.event(Event::SidrRequest {
            conn: ConnId(id),
            peer: from,
            req: *r,
        });
    }

    fn on_sidr_rep(&mut self, r: &SidrRep) {
        match self.find_local(r.request_id) {
            Some(slot) if self.slots[slot].is_some_and(|c| c.state == State::SidrReqSent) => {
                self.slots[slot] = None;
                self.event(Event::SidrResolved {
                    conn: ConnId(r.request_id),
                    rep: *r,
                });
            }
            _ => self.counters.rx_unknown_conn += 1,
        }
    }

    fn sidr_rep(
        &self,
        request_id: u32,
        sid: u64,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
    ) -> Message {
        Message::SidrRep(SidrRep {
            request_id,
            status,
            additional_info_len: 0,
            vendor_id: 0,
            qpn,
            service_id: sid,
            qkey,
            additional_info: [0; cm::ARI_LEN],
            private_data: [0; cm::private_len::SIDR_REP],
        })
    }

    // --- slots ---

    fn get(&self, id: u32) -> Option<&Conn> {
        self.find_local(id).and_then(|s| self.slots[s].as_ref())
    }

    /// The slot a local communication ID names, if its occupant still has that ID.
    fn find_local(&self, id: u32) -> Option<usize> {
        let slot = (id & 0xffff) as usize;
        self.slots
            .get(slot)
            .and_then(|c| c.as_ref())
            .filter(|c| c.id == id)
            .map(|_| slot)
    }

    /// The slot of a connection the peer names by its own ID (a duplicate REQ or SIDR_REQ).
    fn find_remote(&self, peer: IpAddr, remote_id: u32, sidr: bool) -> Option<usize> {
        self.slots.iter().position(|c| {
            c.is_some_and(|c| {
                c.peer == peer
                    && c.remote_id == remote_id
                    && c.sidr == sidr
                    && !matches!(
                        c.state,
                        State::ReqSent | State::MraReqRcvd | State::SidrReqSent
                    )
            })
        })
    }

    fn slot_of(&self, conn: ConnId, states: &[State]) -> Result<usize, CmError> {
        let slot = self.find_local(conn.0).ok_or(CmError::NoConn)?;
        let st = self.slots[slot].expect("found").state;
        if states.contains(&st) {
            Ok(slot)
        } else {
            Err(CmError::WrongState(st.name()))
        }
    }

    fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(Option::is_none)
    }

    fn oldest_half_open(&self) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                c.filter(|c| c.state.half_open_passive())
                    .map(|c| (c.born, i))
            })
            .min()
            .map(|(_, i)| i)
    }

    /// The next communication ID of a slot: its generation (never making the ID 0) and index.
    fn id_for(&mut self, slot: usize) -> u32 {
        let g = &mut self.gens[slot];
        *g = g.wrapping_add(1);
        if *g == 0 && slot == 0 {
            *g = 1;
        }
        (*g as u32) << 16 | slot as u32
    }

    fn new_tid(&mut self) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        self.next_tid
    }

    fn wait(&self, code: u8) -> Duration {
        timeout_of(code) + 2 * self.cfg.packet_life
    }

    fn set_state(&mut self, slot: usize, st: State) {
        if let Some(c) = self.slots[slot].as_mut() {
            c.state = st;
        }
    }

    fn enter_timewait(&mut self, slot: usize, now: Instant) {
        let tw = self.cfg.timewait;
        if let Some(c) = self.slots[slot].as_mut() {
            c.state = State::Timewait;
            c.deadline = Some(now + tw);
        }
    }

    // --- sending ---

    fn encode(msg: &Message, tid: u64) -> [u8; MAD_LEN] {
        let mut mad = [0u8; MAD_LEN];
        msg.emit(tid, &mut mad).expect("a MAD-sized buffer");
        mad
    }

    /// Sends a message a timeout resends.
    fn send_timed(&mut self, slot: usize, msg: Message, tid: u64, now: Instant, wait: Duration) {
        let mad = Self::encode(&msg, tid);
        let Some(c) = self.slots[slot].as_mut() else {
            return;
        };
        c.last = mad;
        c.tid = tid;
        c.deadline = Some(now + wait);
        c.retries_left = c.max_retries;
        let to = c.peer;
        self.push_tx(to, mad);
    }

    /// Sends a message nothing resends, kept to answer a duplicate with.
    fn send_untimed(&mut self, slot: usize, msg: Message, tid: u64) {
        let mad = Self::encode(&msg, tid);
        let Some(c) = self.slots[slot].as_mut() else {
            return;
        };
        c.last = mad;
        c.deadline = None;
        let to = c.peer;
        self.push_tx(to, mad);
    }

    fn emit_to(&mut self, to: IpAddr, msg: Message, tid: u64) {
        let mad = Self::encode(&msg, tid);
        self.push_tx(to, mad);
    }

    #[allow(clippy::too_many_arguments)]
    fn send_rej(
        &mut self,
        to: IpAddr,
        tid: u64,
        local: u32,
        remote: u32,
        kind: MsgKind,
        reason: RejReason,
        private_data: &[u8],
    ) {
        let mut pd = [0u8; cm::private_len::REJ];
        let n = private_data.len().min(pd.len());
        pd[..n].copy_from_slice(&private_data[..n]);
        let rej = Message::Rej(Rej {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: kind,
            ari_len: 0,
            reason,
            ari: [0; cm::ARI_LEN],
            private_data: pd,
        });
        self.counters.tx_rej += 1;
        self.emit_to(to, rej, tid);
    }

    fn push_tx(&mut self, to: IpAddr, mad: [u8; MAD_LEN]) {
        if self.tx.len() >= self.cfg.queue {
            self.counters.queue_full += 1;
            return;
        }
        self.counters.tx += 1;
        self.tx.push_back(Transmit { to, mad });
    }

    fn event(&mut self, e: Event) {
        if self.events.len() >= self.cfg.queue {
            self.counters.queue_full += 1;
            return;
        }
        self.events.push_back(e);
    }
}

impl Conn {
    fn new(id: u32, state: State, peer: IpAddr, tid: u64, now: Instant) -> Conn {
        Conn {
            id,
            state,
            peer,
            remote_id: 0,
            remote_qpn: 0,
            tid,
            last: [0; MAD_LEN],
            deadline: None,
            retries_left: 0,
            peer_timeout: 0,
            max_retries: 0,
            born: now,
            sidr: false,
            service_id: 0,
        }
    }
}

/// rdma_cm's service ID of a TCP port (RDMA_PS_TCP): what rping, perftest -R and NVMe-oF
/// connect to.
pub fn service_id_of(port: u16) -> u64 {
    cm::service_id(cm::PortSpace::Tcp, port)
}

/// The CA GUID of a port with MAC address `mac`, as rxe makes its node GUID (the modified
/// EUI-64 of the MAC: the universal/local bit flipped, ff:fe in the middle), as the value
/// whose big-endian bytes a MAD carries.
pub fn ca_guid_of(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

/// An IP address as the GID RoCEv2 carries for it (IPv4-mapped for IPv4).
pub fn gid_of(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}
