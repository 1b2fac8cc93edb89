//! RDMA CM on the node: listeners, connections, and the QP moves their REQs and REPs carry.
//!
//! The CM's state machine runs on the lcore owning QP1 (shard 0's `Gsi`, sans-IO). Its events
//! come here over a bounded channel into a book (`CmShared`), which the waiting calls read:
//! a connect waits for its REP, moves its QP RESET -> INIT -> RTR -> RTS with what the REP
//! carries, then has the RTU sent; an accept takes a REQ from its listener's backlog, moves
//! its QP with what the REQ carries, then has the REP sent and waits for the RTU. The lcore
//! never waits for us: a REQ nobody takes is answered by the CM's own timers (the peer
//! retries, then gives up), one past the backlog is rejected at once.
//!
//! What the QPs get follows Linux's ib_cm and rdma_cm (`cm_init_qp_*_attr`): the peer's QPN;
//! PSNs as Linux puts them on the wire (rxe's rping capture, tests/data/rxe/rping_cm.pcap:
//! the passive side sends from the REQ's starting PSN and the active side from the REP's, so
//! each message's starting PSN is the one its sender expects to receive); the path MTU both sides can carry, READs and atomics each way as the REQ and
//! REP settle them (the responder resources one side offers bound the other's initiator
//! depth), remote write always and remote read and atomic when the QP answers READs, the
//! active side's retry count, each side's RNR retry count as the other gave it.

use super::*;
use crossbeam_channel::Receiver;
use dataplane::transport::cm::{
    AcceptParams, CmError, ConnId, ConnectParams, Event, gid_of, service_id_of,
};
use dataplane::transport::gsi::PeerPath;
use dataplane::transport::mr::Access;
use dataplane::wire::cm::{
    CmaHeader, PortSpace, RejReason, Rep, Req, SidrStatus, UDP_QKEY, split_service_id,
};
use std::collections::VecDeque;
use std::sync::Arc;
use verbs::proto::{CmEventKind, CmEventMsg};

/// Connections a listener holds unaccepted at most (rdma_listen's backlog bound).
pub const MAX_BACKLOG: usize = 1024;
/// Connections the book remembers at most; past it the oldest finished ones are forgotten.
const BOOK_MAX: usize = 4096;
/// Events the lcore may have sent ahead of the book.
const EVENT_QUEUE: usize = 4096;
/// The ACK timeout code a connect's QP takes (67 ms), as rdma_cm's default path record does.
const ACK_TIMEOUT: u8 = 14;
/// The RNR NAK timer code our QPs send (0.64 ms: perftest's and rdma_cm users' usual 12).
const MIN_RNR_TIMER: u8 = 12;
/// The longest a connect or accept waits, whatever the caller asks.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// What `rdma_connect` and `rdma_accept` may say of a connection beyond its QP and peer.
#[derive(Clone, Debug, Default)]
pub struct CmOpts {
    /// The application's private data: after rdma_cm's header in a REQ (56 bytes at most),
    /// the REP's (196).
    pub private_data: Vec<u8>,
    /// READs and atomics answered at once (0: as many as the device offers; never more).
    pub responder_resources: u8,
    /// READs and atomics outstanding at once (0: as many as the device offers; never more).
    pub initiator_depth: u8,
    /// Transport retries (the CM's default if None).
    pub retry_count: Option<u8>,
    /// RNR retries (the CM's default if None).
    pub rnr_retry_count: Option<u8>,
    /// Where the connection's ends are told (an attached application's channel).
    pub watch: Option<CmWatch>,
}

impl CmOpts {
    /// READs and atomics a side asked for, bounded by the device's.
    fn rd(&self, asked: u8) -> u8 {
        let dev = dataplane::transport::qp::DEFAULT_RD_ATOMIC;
        if asked == 0 { dev } else { asked.min(dev) }
    }
}

/// rdma_cm's port spaces the node serves: RC connections, and UD services resolved by SIDR.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CmSpace {
    /// RDMA_PS_TCP: RC QPs, REQ/REP/RTU (rping, perftest -R).
    #[default]
    Tcp,
    /// RDMA_PS_UDP: UD QPs, SIDR_REQ/SIDR_REP (udaddy).
    Udp,
}

impl CmSpace {
    /// The service ID of `port` in this space.
    pub fn service_id(self, port: u16) -> u64 {
        dataplane::wire::cm::service_id(
            match self {
                CmSpace::Tcp => PortSpace::Tcp,
                CmSpace::Udp => PortSpace::Udp,
            },
            port,
        )
    }
}

/// Which side of a connection the node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CmRole {
    /// It sent the REQ.
    Active,
    /// It listened and got the REQ.
    Passive,
}

/// Where a connection stands, as the book knows it.
#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Passive: a REQ waits in a listener's backlog.
    Requested(Req),
    /// Passive: an accept took it; its QP is being moved.
    Accepting,
    /// Active: the REQ is out.
    Connecting,
    /// Passive SIDR: a SIDR_REQ waits in a listener's backlog.
    SidrRequested,
    /// Active SIDR: the SIDR_REQ is out.
    Resolving,
    /// SIDR: answered with a UD QP (ours when passive, the peer's when active).
    Resolved,
    /// SIDR: the peer answered with a status other than OK.
    SidrRefused(SidrStatus),
    /// Active: the REP came.
    Replied(Rep),
    /// Passive: REP sent, waiting for the RTU.
    RepSent,
    /// Both: the connection is up.
    Established,
    /// Our DREQ is out; the DREP (or the CM giving up on it) ends it.
    Disconnecting,
    /// The peer (or we) refused it.
    Rejected(RejReason),
    /// The peer never answered.
    Unreachable,
    /// A DREQ came, or ours was answered or given up on.
    Disconnected,
    /// The CM dropped it (evicted, or TIMEWAIT over).
    Gone,
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::Requested(_) => "requested",
            Phase::Accepting => "accepting",
            Phase::Connecting => "connecting",
            Phase::SidrRequested => "requested",
            Phase::Resolving => "resolving",
            Phase::Resolved => "resolved",
            Phase::SidrRefused(_) => "refused",
            Phase::Replied(_) => "replied",
            Phase::RepSent => "rep_sent",
            Phase::Established => "established",
            Phase::Disconnecting => "disconnecting",
            Phase::Rejected(_) => "rejected",
            Phase::Unreachable => "unreachable",
            Phase::Disconnected => "disconnected",
            Phase::Gone => "gone",
        }
    }

    fn finished(&self) -> bool {
        matches!(
            self,
            Phase::Rejected(_)
                | Phase::Unreachable
                | Phase::Disconnected
                | Phase::Gone
                | Phase::Resolved
                | Phase::SidrRefused(_)
        )
    }
}

#[derive(Clone, Copy, Debug)]
struct Conn {
    role: CmRole,
    space: CmSpace,
    /// The service's port.
    port: u16,
    peer: IpAddr,
    /// The peer's source port, from its rdma_cm header (passive).
    peer_port: Option<u16>,
    qpn: Option<u32>,
    remote_qpn: Option<u32>,
    /// The peer's UD QP's Q_Key (active SIDR).
    remote_qkey: Option<u32>,
    /// The peer's REP (active).
    rep: Option<Rep>,
    phase: Phase,
    since: Instant,
}

/// A connection as the node lists it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CmConnInfo {
    /// Its communication ID (ours).
    pub id: u32,
    /// Active or passive.
    pub role: CmRole,
    /// rdma_cm's port space: tcp (an RC connection) or udp (a UD service resolved by SIDR).
    pub space: CmSpace,
    /// requested, accepting, connecting, replied, rep_sent, established, disconnecting,
    /// rejected, unreachable, disconnected or gone; for SIDR requested, resolving, resolved
    /// or refused.
    pub state: &'static str,
    /// The service's port.
    pub port: u16,
    /// The peer's address.
    pub peer: IpAddr,
    /// The peer's rdma_cm source port, when its REQ said.
    pub peer_port: Option<u16>,
    /// Our QP.
    pub qpn: Option<u32>,
    /// The peer's QP.
    pub remote_qpn: Option<u32>,
    /// The peer's UD QP's Q_Key (a SIDR resolve's answer).
    pub remote_qkey: Option<u32>,
    /// Why it was refused, for a rejected one (for SIDR, the SIDR_REP's status code).
    pub reject_reason: Option<&'static str>,
    /// Milliseconds since its last change.
    pub age_ms: u64,
}

/// A listener as the node lists it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CmListenerInfo {
    /// The port listened on.
    pub port: u16,
    /// Its port space.
    pub space: CmSpace,
    /// Its service ID.
    pub service_id: String,
    /// REQs it holds at most unaccepted.
    pub backlog: usize,
    /// REQs waiting for an accept.
    pub waiting: usize,
}

#[derive(Default)]
struct Book {
    conns: BTreeMap<u32, Conn>,
    /// (Space, port) -> (backlog bound, REQs or SIDR_REQs waiting, oldest first).
    listeners: BTreeMap<(CmSpace, u16), (usize, VecDeque<u32>)>,
    /// Listeners of attached applications: where their requests are told.
    listen_watch: BTreeMap<(CmSpace, u16), CmWatch>,
    /// Connections of attached applications: where their ends are told.
    conn_watch: BTreeMap<u32, CmWatch>,
}

/// Where an attached application hears of a listener or connection of its own (an event
/// channel's socket, [`verbs::proto::Request::CmChannel`]), and the handle its events name.
#[derive(Clone, Debug)]
pub struct CmWatch {
    /// roced's end of the channel's socket.
    pub sock: Arc<rustix::fd::OwnedFd>,
    /// The application's handle of the ID.
    pub id: u64,
}

impl CmWatch {
    /// Tells `e` (its `id` set to the watch's); an event the socket has no room for is
    /// dropped and logged: an application that never reads its channel does not hold roced.
    pub fn tell(&self, mut e: CmEventMsg) {
        e.id = self.id;
        if !verbs::proto::post_cm_event(&*self.sock, &e) {
            tracing::warn!(event = ?e.kind, conn = e.conn, "application's CM channel full or closed: event dropped");
        }
    }
}

/// What a REQ or SIDR_REQ tells the listening application.
fn request_event(conn: u32, peer: IpAddr, private: &[u8], req: Option<&Req>) -> CmEventMsg {
    let h = CmaHeader::parse(private).ok();
    let mut e = CmEventMsg {
        kind: CmEventKind::ConnectRequest,
        conn,
        private_data: private
            .get(dataplane::wire::cm::CMA_HEADER_LEN..)
            .unwrap_or(&[])
            .to_vec(),
        peer: Some(peer.to_string()),
        peer_port: h.map_or(0, |h| h.src_port),
        local: h.map(|h| h.dst.to_canonical().to_string()),
        ..Default::default()
    };
    if let Some(r) = req {
        e.remote_qpn = r.local_qpn;
        e.responder_resources = r.responder_resources;
        e.initiator_depth = r.initiator_depth;
        e.retry_count = r.retry_count;
        e.rnr_retry_count = r.rnr_retry_count;
    }
    e
}

impl Conn {
    fn info(&self, id: u32, now: Instant) -> CmConnInfo {
        let c = self;
        CmConnInfo {
            id,
            role: c.role,
            space: c.space,
            state: c.phase.name(),
            port: c.port,
            peer: c.peer,
            peer_port: c.peer_port,
            qpn: c.qpn,
            remote_qpn: c.remote_qpn,
            remote_qkey: c.remote_qkey,
            reject_reason: match c.phase {
                Phase::Rejected(r) => Some(r.name()),
                Phase::SidrRefused(st) => Some(sidr_status_name(st)),
                _ => None,
            },
            age_ms: now.saturating_duration_since(c.since).as_millis() as u64,
        }
    }
}

impl Book {
    /// Forgets the oldest finished connections past [`BOOK_MAX`].
    fn prune(&mut self) {
        while self.conns.len() > BOOK_MAX {
            let oldest = self
                .conns
                .iter()
                .filter(|(_, c)| c.phase.finished())
                .min_by_key(|(_, c)| c.since)
                .map(|(id, _)| *id);
            match oldest {
                Some(id) => {
                    self.conns.remove(&id);
                }
                None => break,
            }
        }
    }

    fn set(&mut self, id: u32, phase: Phase) -> Option<&mut Conn> {
        let c = self.conns.get_mut(&id)?;
        c.phase = phase;
        c.since = Instant::now();
        Some(c)
    }

    /// Puts passive request `id` (a REQ, or a SIDR_REQ: `phase` says which) for `sid` from
    /// `peer` with rdma_cm's header in `private` in its listener's backlog, and in the book.
    /// Refused: `Err(true)` when nothing listens on the service in the request's port space,
    /// `Err(false)` when its backlog is full.
    fn queue(
        &mut self,
        id: u32,
        (sid, peer, private): (u64, IpAddr, &[u8]),
        remote_qpn: Option<u32>,
        phase: Phase,
        now: Instant,
    ) -> Result<(), bool> {
        let space = match (split_service_id(sid), phase) {
            (Some((PortSpace::Tcp, p)), Phase::Requested(_)) => (CmSpace::Tcp, p),
            (Some((PortSpace::Udp, p)), Phase::SidrRequested) => (CmSpace::Udp, p),
            _ => return Err(true),
        };
        match self.listeners.get_mut(&space) {
            Some((max, q)) if q.len() < *max => q.push_back(id),
            Some(_) => return Err(false),
            None => return Err(true),
        }
        self.conns.insert(
            id,
            Conn {
                role: CmRole::Passive,
                space: space.0,
                port: space.1,
                peer,
                peer_port: CmaHeader::parse(private).ok().map(|h| h.src_port),
                qpn: None,
                remote_qpn,
                remote_qkey: None,
                rep: None,
                phase,
                since: now,
            },
        );
        self.prune();
        Ok(())
    }

    /// A request that came to an attached application's listener is told to it, and is then
    /// the application's (as an rdma_cm child ID is): out of the backlog, watched by the
    /// listener's channel until accepted or rejected, and no longer its listener's (which may
    /// go first).
    fn deliver(&mut self, id: u32, listener: (CmSpace, u16), tell: impl FnOnce(&CmWatch)) {
        let Some(w) = self.listen_watch.get(&listener).cloned() else {
            return;
        };
        self.unqueue(id);
        tell(&w);
        self.conn_watch.insert(id, w);
    }

    /// Request `id` in `space` waits for its accept: in a listener's backlog, or delivered to
    /// an application ([`Book::deliver`]).
    fn pending(&self, id: u32, space: CmSpace) -> bool {
        let queued = self
            .listeners
            .iter()
            .any(|((s, _), (_, q))| *s == space && q.contains(&id));
        queued
            || (self.conn_watch.contains_key(&id)
                && self.conns.get(&id).is_some_and(|c| {
                    c.space == space
                        && matches!(c.phase, Phase::Requested(_) | Phase::SidrRequested)
                }))
    }

    fn unqueue(&mut self, id: u32) {
        for (_, q) in self.listeners.values_mut() {
            q.retain(|&c| c != id);
        }
    }
}

/// The node's side of the CM: the book, and how it reaches the lcores.
pub(super) struct CmShared {
    book: Mutex<Book>,
    changed: Condvar,
    lcores: Vec<Sender<Command<ApplianceCommand>>>,
    /// The event channel has been given to shard 0 and its pump started.
    started: Mutex<bool>,
}

impl CmShared {
    pub(super) fn new(lcores: Vec<Sender<Command<ApplianceCommand>>>) -> Self {
        CmShared {
            book: Mutex::new(Book::default()),
            changed: Condvar::new(),
            lcores,
            started: Mutex::new(false),
        }
    }

    /// Runs `f` on `lcore` without waiting for it (the pump must never wait on an lcore).
    fn tell(&self, lcore: usize, f: impl FnOnce(&mut Shard, dataplane::Instant) + Send + 'static) {
        let (tx, _rx) = bounded::<()>(1);
        if let Some(l) = self.lcores.get(lcore) {
            let _ = l.send(Command::Handler(ApplianceCommand::Rdma(RdmaCommand::call(
                tx,
                move |h, now| f(h, now),
            ))));
        }
    }

    /// Moves QP `qpn` to ERR on its lcore, as rdma_cm does when a connection goes down.
    fn fail_qp(&self, qpn: u32) {
        self.tell(shard_of(qpn) as usize, move |h, _| {
            let err = QpAttr {
                state: Some(QpState::Err),
                ..Default::default()
            };
            let _ = h.dev.modify(qpn, &err, 0);
        });
    }

    /// Rejects connection `conn` on the CM's lcore (a REQ nobody will take, a REP we cannot
    /// use).
    fn reject(&self, conn: u32, reason: RejReason) {
        self.tell(0, move |h, _| {
            if let Some(g) = h.gsi.as_mut() {
                let _ = g.cm.reject(ConnId(conn), reason, &[]);
                g.rearm();
            }
        });
    }

    /// Answers SIDR request `conn` with `status` and no QP (a listener past its backlog, an
    /// accept that failed).
    fn sidr_refuse(&self, conn: u32, status: SidrStatus) {
        self.tell(0, move |h, now| {
            if let Some(g) = h.gsi.as_mut() {
                let _ = g.cm.sidr_reply(now, ConnId(conn), status, 0, 0);
                g.rearm();
            }
        });
    }

    /// One event from the CM into the book.
    fn apply(&self, e: Event) {
        let now = Instant::now();
        let mut b = self.book.lock().expect("cm book");
        match e {
            Event::Request { conn, peer, req } => {
                let queued = b.queue(
                    conn.0,
                    (req.service_id, peer, &req.private_data),
                    Some(req.local_qpn),
                    Phase::Requested(req),
                    now,
                );
                if let Err(no_listener) = queued {
                    drop(b);
                    let reason = if no_listener {
                        RejReason::InvalidServiceId
                    } else {
                        RejReason::NoResources
                    };
                    self.reject(conn.0, reason);
                    return;
                }
                if let Some((CmSpace::Tcp, port)) = b.conns.get(&conn.0).map(|c| (c.space, c.port))
                {
                    b.deliver(conn.0, (CmSpace::Tcp, port), |w| {
                        w.tell(request_event(conn.0, peer, &req.private_data, Some(&req)))
                    });
                }
            }
            Event::Reply { conn, rep } => {
                if let Some(c) = b.conns.get_mut(&conn.0) {
                    c.remote_qpn = Some(rep.local_qpn);
                    c.rep = Some(rep);
                }
                if b.set(conn.0, Phase::Replied(rep)).is_none() {
                    // Nobody asked for it (the connect gave up): refuse it.
                    drop(b);
                    self.reject(conn.0, RejReason::ConsumerReject);
                    return;
                }
            }
            Event::Established { conn } => {
                b.set(conn.0, Phase::Established);
            }
            Event::Rejected { conn, reason } => {
                b.unqueue(conn.0);
                b.set(conn.0, Phase::Rejected(reason));
            }
            Event::Unreachable { conn } => {
                b.unqueue(conn.0);
                b.set(conn.0, Phase::Unreachable);
            }
            Event::Disconnected { conn } => {
                let qpn = b.set(conn.0, Phase::Disconnected).and_then(|c| c.qpn);
                if let Some(q) = qpn {
                    self.fail_qp(q);
                }
                if let Some(w) = b.conn_watch.get(&conn.0) {
                    w.tell(CmEventMsg {
                        kind: CmEventKind::Disconnected,
                        conn: conn.0,
                        ..Default::default()
                    });
                }
            }
            Event::TimewaitExit { conn } | Event::Evicted { conn } => {
                b.unqueue(conn.0);
                b.set(conn.0, Phase::Gone);
            }
            Event::SidrRequest { conn, peer, req } => {
                let queued = b.queue(
                    conn.0,
                    (req.service_id, peer, &req.private_data),
                    None,
                    Phase::SidrRequested,
                    now,
                );
                if let Err(no_listener) = queued {
                    drop(b);
                    let status = if no_listener {
                        SidrStatus::NoServiceId
                    } else {
                        SidrStatus::NoQp
                    };
                    self.sidr_refuse(conn.0, status);
                    return;
                }
                if let Some((CmSpace::Udp, port)) = b.conns.get(&conn.0).map(|c| (c.space, c.port))
                {
                    b.deliver(conn.0, (CmSpace::Udp, port), |w| {
                        w.tell(request_event(conn.0, peer, &req.private_data, None))
                    });
                }
            }
            Event::SidrResolved { conn, rep } => {
                let phase = match rep.status {
                    SidrStatus::Ok => Phase::Resolved,
                    st => Phase::SidrRefused(st),
                };
                if let Some(c) = b.set(conn.0, phase)
                    && rep.status == SidrStatus::Ok
                {
                    c.remote_qpn = Some(rep.qpn);
                    c.remote_qkey = Some(rep.qkey);
                }
            }
            Event::SidrUnreachable { conn } => {
                b.set(conn.0, Phase::Unreachable);
            }
        }
        drop(b);
        self.changed.notify_all();
    }

    /// Waits until connection `id` leaves the phases `waiting` names, or `deadline`.
    fn wait(&self, id: u32, deadline: Instant, waiting: impl Fn(&Phase) -> bool) -> Option<Phase> {
        let mut b = self.book.lock().expect("cm book");
        loop {
            match b.conns.get(&id) {
                Some(c) if !waiting(&c.phase) => return Some(c.phase),
                None => return Some(Phase::Gone),
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            b = self.changed.wait_timeout(b, left).expect("cm book").0;
        }
    }
}

/// Moves events from the CM's lcore into the book until the lcore goes.
fn pump(shared: Arc<CmShared>, rx: Receiver<Event>) {
    while let Ok(e) = rx.recv() {
        shared.apply(e);
    }
}

fn cm_error(e: CmError) -> RdmaError {
    match e {
        CmError::NoConn => RdmaError::not_found("no such CM connection"),
        CmError::WrongState(s) => {
            RdmaError::conflict("bad_state", format!("the connection is {s}"))
        }
        CmError::NoSlot | CmError::TooManyListens => RdmaError::conflict("too_many", e.to_string()),
        CmError::Listening => RdmaError::conflict("listening", e.to_string()),
        CmError::PrivateDataTooLong(_) => RdmaError::bad("bad_private_data", e.to_string()),
    }
}

fn timed_out(message: String) -> RdmaError {
    RdmaError {
        kind: Refusal::Expired,
        code: "timed_out",
        message,
    }
}

/// A connection's end as the caller hears it.
fn ended(phase: Phase, what: &str) -> RdmaError {
    match phase {
        Phase::Rejected(r) => RdmaError::conflict(
            "cm_rejected",
            format!("{what}: rejected ({}, reason {})", r.name(), r.code()),
        ),
        Phase::SidrRefused(st) => RdmaError::conflict(
            "cm_rejected",
            format!(
                "{what}: refused (SIDR status {}, {})",
                st.code(),
                sidr_status_name(st)
            ),
        ),
        Phase::Unreachable => RdmaError {
            kind: Refusal::Expired,
            code: "cm_unreachable",
            message: format!("{what}: no answer from the peer after every CM retry"),
        },
        p => RdmaError::conflict(
            "cm_closed",
            format!("{what}: the connection is {}", p.name()),
        ),
    }
}

/// A SIDR_REP status as the node names it.
fn sidr_status_name(st: SidrStatus) -> &'static str {
    match st {
        SidrStatus::Ok => "ok",
        SidrStatus::NoServiceId => "service ID not supported",
        SidrStatus::Rejected => "rejected",
        SidrStatus::NoQp => "no QP",
        SidrStatus::Redirect => "redirect",
        SidrStatus::UnsupportedVersion => "unsupported version",
        SidrStatus::Other(_) => "other",
    }
}

/// The remote rights an RC QP of a CM connection takes: remote write, and read and atomic
/// when it answers READs (ib_cm's `cm_init_qp_init_attr`).
fn access_for(max_dest_rd_atomic: u8) -> Access {
    if max_dest_rd_atomic > 0 {
        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
    } else {
        Access::REMOTE_WRITE
    }
}

impl Rdma {
    /// Gives shard 0's CM its event channel and starts the pump (once).
    fn cm_start(&self) -> Result<(), RdmaError> {
        let mut started = self.cm.started.lock().expect("cm start");
        if *started {
            return Ok(());
        }
        let (tx, rx) = bounded(EVENT_QUEUE);
        let has_gsi = self.ask(0, move |h, _| {
            h.cm_events = Some(tx);
            h.gsi.is_some()
        })?;
        if !has_gsi {
            return Err(RdmaError::internal("no_cm", "lcore 0 has no QP1"));
        }
        let shared = self.cm.clone();
        std::thread::Builder::new()
            .name("cm".into())
            .spawn(move || pump(shared, rx))
            .map_err(|e| RdmaError::internal("no_thread", e.to_string()))?;
        *started = true;
        Ok(())
    }

    /// Listens on `port` of rdma_cm's port space `space` with room for `backlog` REQs (or
    /// SIDR_REQs) unaccepted.
    pub fn cm_listen(
        &self,
        port: u16,
        space: CmSpace,
        backlog: usize,
    ) -> Result<CmListenerInfo, RdmaError> {
        self.cm_listen_for(port, space, backlog, None)
    }

    /// [`Rdma::cm_listen`] for an attached application: each request is told to `watch`
    /// as it comes.
    pub fn cm_listen_for(
        &self,
        port: u16,
        space: CmSpace,
        backlog: usize,
        watch: Option<CmWatch>,
    ) -> Result<CmListenerInfo, RdmaError> {
        if backlog == 0 || backlog > MAX_BACKLOG {
            return Err(RdmaError::bad(
                "bad_backlog",
                format!("backlog must be 1 to {MAX_BACKLOG}"),
            ));
        }
        self.cm_start()?;
        let mut b = self.cm.book.lock().expect("cm book");
        if b.listeners.contains_key(&(space, port)) {
            return Err(RdmaError::conflict(
                "listening",
                format!("port {port} is listened on already"),
            ));
        }
        let sid = space.service_id(port);
        self.ask(0, move |h, _| match h.gsi.as_mut() {
            Some(g) => {
                let r = g.cm.listen(sid);
                // Requests that came just before it are due now.
                g.rearm();
                r
            }
            None => Err(CmError::NoConn),
        })?
        .map_err(cm_error)?;
        b.listeners
            .insert((space, port), (backlog, VecDeque::new()));
        if let Some(w) = watch {
            b.listen_watch.insert((space, port), w);
        }
        Ok(CmListenerInfo {
            port,
            space,
            service_id: format!("{sid:#018x}"),
            backlog,
            waiting: 0,
        })
    }

    /// Stops listening on `port` of `space`; REQs (SIDR_REQs) still waiting are refused.
    pub fn cm_unlisten(&self, port: u16, space: CmSpace) -> Result<(), RdmaError> {
        let mut b = self.cm.book.lock().expect("cm book");
        b.listen_watch.remove(&(space, port));
        let Some((_, waiting)) = b.listeners.remove(&(space, port)) else {
            return Err(RdmaError::not_found(format!(
                "nothing listens on port {port}"
            )));
        };
        let sid = space.service_id(port);
        self.ask(0, move |h, _| {
            if let Some(g) = h.gsi.as_mut() {
                g.cm.unlisten(sid);
            }
        })?;
        for id in waiting {
            match space {
                CmSpace::Tcp => {
                    b.set(id, Phase::Rejected(RejReason::ConsumerReject));
                    self.cm.reject(id, RejReason::ConsumerReject);
                }
                CmSpace::Udp => {
                    b.set(id, Phase::SidrRefused(SidrStatus::Rejected));
                    self.cm.sidr_refuse(id, SidrStatus::Rejected);
                }
            }
        }
        drop(b);
        self.cm.changed.notify_all();
        Ok(())
    }

    /// The listeners.
    pub fn cm_listeners(&self) -> Vec<CmListenerInfo> {
        let b = self.cm.book.lock().expect("cm book");
        b.listeners
            .iter()
            .map(|(&(space, port), (max, q))| CmListenerInfo {
                port,
                space,
                service_id: format!("{:#018x}", space.service_id(port)),
                backlog: *max,
                waiting: q.len(),
            })
            .collect()
    }

    /// The connections the book holds, oldest communication ID first.
    pub fn cm_connections(&self) -> Vec<CmConnInfo> {
        let now = Instant::now();
        let b = self.cm.book.lock().expect("cm book");
        b.conns.iter().map(|(&id, c)| c.info(id, now)).collect()
    }

    /// Connection `id`.
    pub fn cm_connection(&self, id: u32) -> Result<CmConnInfo, RdmaError> {
        let b = self.cm.book.lock().expect("cm book");
        let c = b
            .conns
            .get(&id)
            .ok_or_else(|| RdmaError::not_found(format!("no CM connection {id}")))?;
        Ok(c.info(id, Instant::now()))
    }

    /// An RC QP in RESET that a CM connection may take, and the PSN it starts with.
    fn cm_qp(&self, qpn: u32) -> Result<(usize, u32), RdmaError> {
        let (_, q) = self.query_qp(qpn)?;
        if q.cfg.qp_type != QpType::Rc {
            return Err(RdmaError::bad(
                "bad_qp",
                format!("QP {qpn} is UD: a CM connection takes an RC QP"),
            ));
        }
        if !matches!(q.cfg.state, QpState::Reset | QpState::Init) {
            return Err(RdmaError::conflict(
                "bad_state",
                format!(
                    "QP {qpn} is in {:?}: a CM connection takes a QP in RESET or INIT",
                    q.cfg.state
                ),
            ));
        }
        let b = self.cm.book.lock().expect("cm book");
        if b.conns
            .values()
            .any(|c| c.qpn == Some(qpn) && !c.phase.finished())
        {
            return Err(RdmaError::conflict(
                "bad_state",
                format!("QP {qpn} belongs to a CM connection already"),
            ));
        }
        Ok((q.port, self.local_psn(qpn, None)?))
    }

    /// The largest path MTU whose packets fit `port` towards an IPv4 (or IPv6) peer.
    fn fit_mtu(&self, port: usize, ipv4: bool) -> Mtu {
        let port_mtu = self.port_mtu(port) as u32;
        let ip = if ipv4 { 20 } else { 40 };
        [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512]
            .into_iter()
            .find(|m| ip + 8 + 12 + 20 + m.bytes() + 4 <= port_mtu)
            .unwrap_or(Mtu::M256)
    }

    /// Connects RC QP `qpn` (in RESET) to whoever listens on `port` at `peer`, as
    /// `rdma_resolve_addr`, `rdma_resolve_route` and `rdma_connect` do: the address resolved
    /// through the node's routes and neighbour table, a REQ with rdma_cm's header, the QP
    /// moved to RTS with what the REP carries, the RTU sent. Waits up to `wait`.
    pub fn cm_connect(
        &self,
        qpn: u32,
        peer: IpAddr,
        port: u16,
        wait: Duration,
    ) -> Result<CmConnInfo, RdmaError> {
        self.cm_connect_with((qpn, peer, port), wait, &CmOpts::default())
            .1
    }

    /// [`Rdma::cm_connect`] with what `rdma_connect`'s parameters say; also the connection's
    /// ID once it has one (to look at how it ended).
    pub fn cm_connect_with(
        &self,
        (qpn, peer, port): (u32, IpAddr, u16),
        wait: Duration,
        o: &CmOpts,
    ) -> (Option<u32>, Result<CmConnInfo, RdmaError>) {
        let mut id = None;
        let r = self.cm_connect_in((qpn, peer, port), wait, o, &mut id);
        (id, r)
    }

    fn cm_connect_in(
        &self,
        (qpn, peer, port): (u32, IpAddr, u16),
        wait: Duration,
        o: &CmOpts,
        id: &mut Option<u32>,
    ) -> Result<CmConnInfo, RdmaError> {
        let user = dataplane::wire::cm::CMA_HEADER_LEN..dataplane::wire::cm::private_len::REQ;
        if o.private_data.len() > user.len() {
            return Err(RdmaError::bad(
                "bad_private_data",
                format!(
                    "a connect's private data is {} bytes at most (after rdma_cm's header)",
                    user.len()
                ),
            ));
        }
        let deadline = Instant::now() + wait.min(MAX_WAIT);
        self.cm_start()?;
        let peer = peer.to_canonical();
        let (qp_port, psn) = self.cm_qp(qpn)?;
        let (dport, local, mac, vlan) = self.resolve(peer)?;
        let gsi_port = self.ask(0, |h, _| h.gsi.as_ref().map(|g| g.port()))?;
        if gsi_port != Some(dport) || qp_port != dport {
            return Err(RdmaError::bad(
                "bad_port",
                format!(
                    "{peer} is reached by port {dport}; the CM runs on port {} and QP {qpn} is \
                     on port {qp_port}",
                    gsi_port.map_or("none".into(), |p| p.to_string())
                ),
            ));
        }
        let mtu = self.fit_mtu(dport, peer.is_ipv4());
        let mut private = [0u8; dataplane::wire::cm::private_len::REQ];
        let src_port = 32768 + (os_random() % 28232) as u16;
        CmaHeader {
            src_port,
            src: local,
            dst: peer,
        }
        .emit(&mut private)
        .map_err(|e| RdmaError::internal("cm", e.to_string()))?;
        private[user.start..user.start + o.private_data.len()].copy_from_slice(&o.private_data);
        let path = dataplane::wire::cm::Path {
            local_gid: gid_of(local),
            remote_gid: gid_of(peer),
            hop_limit: 64,
            local_ack_timeout: ACK_TIMEOUT,
            ..Default::default()
        };
        let base = ConnectParams::new(service_id_of(port), peer, path, qpn, psn);
        let cp = ConnectParams {
            path_mtu: dataplane::wire::cm::path_mtu_code(mtu.bytes()).unwrap_or(3),
            responder_resources: o.rd(o.responder_resources),
            initiator_depth: o.rd(o.initiator_depth),
            retry_count: o.retry_count.unwrap_or(base.retry_count).min(7),
            rnr_retry_count: o.rnr_retry_count.unwrap_or(base.rnr_retry_count).min(7),
            private_data: private,
            ..base
        };
        let pp = PeerPath {
            peer,
            local,
            peer_mac: mac.0,
            local_mac: self.macs[dport].0,
            vlan: vlan.map(|(vid, pcp)| dataplane::wire::eth::VlanTag {
                pcp,
                dei: false,
                vid,
            }),
        };
        // The book holds the connection before the CM can answer for it.
        let mut b = self.cm.book.lock().expect("cm book");
        let conn = self
            .ask(0, move |h, now| match h.gsi.as_mut() {
                Some(g) => {
                    g.learn(pp);
                    let r = g.cm.connect(now, &cp);
                    g.rearm();
                    r
                }
                None => Err(CmError::NoConn),
            })?
            .map_err(cm_error)?;
        b.conns.insert(
            conn.0,
            Conn {
                role: CmRole::Active,
                space: CmSpace::Tcp,
                port,
                peer,
                peer_port: Some(port),
                qpn: Some(qpn),
                remote_qpn: None,
                remote_qkey: None,
                rep: None,
                phase: Phase::Connecting,
                since: Instant::now(),
            },
        );
        *id = Some(conn.0);
        if let Some(w) = &o.watch {
            b.conn_watch.insert(conn.0, w.clone());
        }
        b.prune();
        drop(b);
        let what = format!("connect to {peer}:{port}");
        let rep = match self
            .cm
            .wait(conn.0, deadline, |p| matches!(p, Phase::Connecting))
        {
            Some(Phase::Replied(rep)) => rep,
            Some(p) => return Err(ended(p, &what)),
            None => {
                self.cm_give_up(conn.0);
                return Err(timed_out(format!("{what}: no REP in {wait:?}")));
            }
        };
        let max_dest = cp.responder_resources;
        let a = QpAttr {
            state: Some(QpState::Rts),
            access: Some(access_for(max_dest)),
            pkey_index: Some(0),
            path_mtu: Some(mtu),
            dest_qp: Some(rep.local_qpn),
            // The REQ carried the PSN we expect; we send from the one the REP carried.
            rq_psn: Some(psn),
            sq_psn: Some(rep.starting_psn),
            timeout: Some(ACK_TIMEOUT),
            retry_cnt: Some(cp.retry_count),
            rnr_retry: Some(rep.rnr_retry_count),
            min_rnr_timer: Some(MIN_RNR_TIMER),
            max_rd_atomic: Some(cp.initiator_depth.min(rep.responder_resources)),
            max_dest_rd_atomic: Some(max_dest),
            path: Some(Path::toward(peer, 0)),
            qkey: None,
        };
        if let Err(e) = self.connect_qp(qpn, &a) {
            self.cm.reject(conn.0, RejReason::ConsumerReject);
            self.cm_forget(conn.0, Phase::Rejected(RejReason::ConsumerReject));
            return Err(e);
        }
        self.ask(0, move |h, _| match h.gsi.as_mut() {
            Some(g) => g.cm.establish(conn),
            None => Err(CmError::NoConn),
        })?
        .map_err(cm_error)?;
        match self
            .cm
            .wait(conn.0, deadline, |p| matches!(p, Phase::Replied(_)))
        {
            Some(Phase::Established) => self.cm_connection(conn.0),
            Some(p) => Err(ended(p, &what)),
            None => Err(timed_out(format!("{what}: not established in {wait:?}"))),
        }
    }

    /// Takes the oldest REQ waiting on `port` (waiting up to `wait` for one), or request
    /// `which` if named (it must be waiting there), moves RC QP `qpn` (in RESET) to RTS with
    /// what it carries, answers with a REP and waits for the RTU, as `rdma_get_cm_event`
    /// (CONNECT_REQUEST), `rdma_accept` and the ESTABLISHED event do. In `space` udp: the
    /// SIDR_REQ, answered with a UD QP.
    pub fn cm_accept(
        &self,
        (port, space, which): (u16, CmSpace, Option<u32>),
        qpn: u32,
        wait: Duration,
    ) -> Result<CmConnInfo, RdmaError> {
        self.cm_accept_with((port, space, which), qpn, wait, &CmOpts::default())
    }

    /// [`Rdma::cm_accept`] with what `rdma_accept`'s parameters say.
    pub fn cm_accept_with(
        &self,
        (port, space, which): (u16, CmSpace, Option<u32>),
        qpn: u32,
        wait: Duration,
        o: &CmOpts,
    ) -> Result<CmConnInfo, RdmaError> {
        if o.private_data.len() > dataplane::wire::cm::private_len::REP {
            return Err(RdmaError::bad(
                "bad_private_data",
                format!(
                    "an accept's private data is {} bytes at most",
                    dataplane::wire::cm::private_len::REP
                ),
            ));
        }
        if space == CmSpace::Udp {
            return self.cm_accept_sidr((port, which), qpn, wait);
        }
        let deadline = Instant::now() + wait.min(MAX_WAIT);
        let (qp_port, psn) = self.cm_qp(qpn)?;
        let (conn, phase, peer) = self.cm_take((CmSpace::Tcp, port, which), qpn, deadline, wait)?;
        if let Some(w) = &o.watch {
            let mut b = self.cm.book.lock().expect("cm book");
            b.conn_watch.insert(conn, w.clone());
        }
        let Phase::Requested(req) = phase else {
            unreachable!("cm_take gives a TCP listener's REQs")
        };
        let what = format!("accept on port {port} from {peer}");
        let gsi_port = self.ask(0, |h, _| h.gsi.as_ref().map(|g| g.port()))?;
        if gsi_port != Some(qp_port) {
            self.cm.reject(conn, RejReason::ConsumerReject);
            self.cm_forget(conn, Phase::Rejected(RejReason::ConsumerReject));
            return Err(RdmaError::bad(
                "bad_port",
                format!("QP {qpn} is on port {qp_port}, and the CM's REQ came in on another"),
            ));
        }
        let fit = self.fit_mtu(qp_port, peer.is_ipv4());
        let mtu = dataplane::wire::cm::path_mtu_bytes(req.path_mtu)
            .and_then(Mtu::from_bytes)
            .map_or(fit, |m| if m.bytes() < fit.bytes() { m } else { fit });
        let mut ap = AcceptParams {
            responder_resources: o.rd(o.responder_resources).min(req.initiator_depth),
            initiator_depth: o.rd(o.initiator_depth).min(req.responder_resources),
            ..AcceptParams::new(qpn, psn)
        };
        ap.private_data[..o.private_data.len()].copy_from_slice(&o.private_data);
        let a = QpAttr {
            state: Some(QpState::Rts),
            access: Some(access_for(ap.responder_resources)),
            pkey_index: Some(0),
            path_mtu: Some(mtu),
            dest_qp: Some(req.local_qpn),
            // The REP carries the PSN we expect; we send from the one the REQ carried.
            rq_psn: Some(psn),
            sq_psn: Some(req.starting_psn),
            timeout: Some(match req.primary.local_ack_timeout {
                0 => ACK_TIMEOUT,
                t => t,
            }),
            retry_cnt: Some(req.retry_count),
            rnr_retry: Some(req.rnr_retry_count),
            min_rnr_timer: Some(MIN_RNR_TIMER),
            max_rd_atomic: Some(ap.initiator_depth),
            max_dest_rd_atomic: Some(ap.responder_resources),
            path: Some(Path::toward(peer, req.primary.traffic_class >> 2)),
            qkey: None,
        };
        if let Err(e) = self.connect_qp(qpn, &a) {
            self.cm.reject(conn, RejReason::ConsumerReject);
            self.cm_forget(conn, Phase::Rejected(RejReason::ConsumerReject));
            return Err(e);
        }
        let accepted = self
            .ask(0, move |h, now| match h.gsi.as_mut() {
                Some(g) => {
                    let r = g.cm.accept(now, ConnId(conn), &ap);
                    g.rearm();
                    r
                }
                None => Err(CmError::NoConn),
            })?
            .map_err(cm_error);
        if let Err(e) = accepted {
            self.cm.fail_qp(qpn);
            self.cm_forget(conn, Phase::Gone);
            return Err(e);
        }
        {
            let mut b = self.cm.book.lock().expect("cm book");
            if let Some(c) = b.conns.get_mut(&conn)
                && matches!(c.phase, Phase::Accepting)
            {
                c.phase = Phase::RepSent;
            }
        }
        match self.cm.wait(conn, deadline, |p| {
            matches!(p, Phase::Accepting | Phase::RepSent)
        }) {
            Some(Phase::Established) => self.cm_connection(conn),
            Some(p) => {
                self.cm.fail_qp(qpn);
                Err(ended(p, &what))
            }
            None => Err(timed_out(format!("{what}: no RTU in {wait:?}"))),
        }
    }

    /// Takes the oldest request waiting on listener (`space`, `port`) for QP `qpn` (marking
    /// it accepting), waiting until `deadline` for one, or request `which` (which must be
    /// waiting there already): its ID, what it asked (a REQ or a SIDR_REQ) and its peer.
    fn cm_take(
        &self,
        (space, port, which): (CmSpace, u16, Option<u32>),
        qpn: u32,
        deadline: Instant,
        wait: Duration,
    ) -> Result<(u32, Phase, IpAddr), RdmaError> {
        let mut b = self.cm.book.lock().expect("cm book");
        // A request delivered to an application is its own, whether or not its listener
        // is still there.
        if let Some(id) = which
            && b.conn_watch.contains_key(&id)
            && b.pending(id, space)
            && let Some(c) = b.conns.get_mut(&id)
            && c.port == port
        {
            let p = c.phase;
            c.phase = Phase::Accepting;
            c.qpn = Some(qpn);
            c.since = Instant::now();
            return Ok((id, p, c.peer));
        }
        loop {
            let Some((_, q)) = b.listeners.get_mut(&(space, port)) else {
                return Err(RdmaError::not_found(format!(
                    "nothing listens on port {port}: POST /v1/cm/listeners first"
                )));
            };
            let next = match which {
                None => q.pop_front(),
                Some(id) => match q.iter().position(|&w| w == id) {
                    Some(i) => q.remove(i),
                    None => {
                        return Err(match b.conns.get(&id) {
                            Some(c) => RdmaError::conflict(
                                "bad_state",
                                format!(
                                    "connection {id} is {}, not a request waiting on port {port}",
                                    c.phase.name()
                                ),
                            ),
                            None => RdmaError::not_found(format!("no CM connection {id}")),
                        });
                    }
                },
            };
            if let Some(id) = next {
                let c = b
                    .conns
                    .get_mut(&id)
                    .expect("a waiting request is in the book");
                if let p @ (Phase::Requested(_) | Phase::SidrRequested) = c.phase {
                    c.phase = Phase::Accepting;
                    c.qpn = Some(qpn);
                    c.since = Instant::now();
                    return Ok((id, p, c.peer));
                }
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out(format!(
                    "no connection request on port {port} in {wait:?}"
                )));
            }
            b = self.cm.changed.wait_timeout(b, left).expect("cm book").0;
        }
    }

    /// A UD QP that may serve a SIDR resolve or accept, brought from RESET to RTS with
    /// rdma_cm's UDP Q_Key on the CM's port if it is there (as `rdma_create_qp` does for a
    /// UD rdma_cm ID), or already in RTS; its port and Q_Key.
    fn cm_ud_qp(&self, qpn: u32) -> Result<(usize, u32), RdmaError> {
        let (_, q) = self.query_qp(qpn)?;
        if q.cfg.qp_type != QpType::Ud {
            return Err(RdmaError::bad(
                "bad_qp",
                format!("QP {qpn} is RC: a SIDR (UDP port space) service takes a UD QP"),
            ));
        }
        match q.cfg.state {
            QpState::Rts => Ok((q.port, q.cfg.qkey)),
            QpState::Reset => {
                let port = self
                    .ask(0, |h, _| h.gsi.as_ref().map(|g| g.port()))?
                    .ok_or_else(|| RdmaError::internal("no_cm", "lcore 0 has no QP1"))?;
                for (state, qkey) in [
                    (QpState::Init, Some(UDP_QKEY)),
                    (QpState::Rtr, None),
                    (QpState::Rts, None),
                ] {
                    let a = QpAttr {
                        state: Some(state),
                        qkey,
                        ..Default::default()
                    };
                    self.modify_qp(qpn, &a, port)?;
                }
                Ok((port, UDP_QKEY))
            }
            s => Err(RdmaError::conflict(
                "bad_state",
                format!("QP {qpn} is in {s:?}: a SIDR service takes a UD QP in RESET or RTS"),
            )),
        }
    }

    /// Asks whoever listens on `port` (rdma_cm's UDP port space) at `peer` which UD QP
    /// serves it, as `rdma_resolve_addr`, `rdma_resolve_route` and `rdma_connect` on a UD
    /// rdma_cm ID do: a SIDR_REQ with rdma_cm's header, and the SIDR_REP's QPN and Q_Key in
    /// the answer (`remote_qpn`, `remote_qkey`). UD QP `qpn` is brought to RTS if in RESET.
    /// Waits up to `wait`.
    pub fn cm_resolve(
        &self,
        qpn: u32,
        peer: IpAddr,
        port: u16,
        wait: Duration,
    ) -> Result<CmConnInfo, RdmaError> {
        let deadline = Instant::now() + wait.min(MAX_WAIT);
        self.cm_start()?;
        let peer = peer.to_canonical();
        let (dport, local, mac, vlan) = self.resolve(peer)?;
        let gsi_port = self.ask(0, |h, _| h.gsi.as_ref().map(|g| g.port()))?;
        if gsi_port != Some(dport) {
            return Err(RdmaError::bad(
                "bad_port",
                format!(
                    "{peer} is reached by port {dport}; the CM runs on port {}",
                    gsi_port.map_or("none".into(), |p| p.to_string())
                ),
            ));
        }
        let (qp_port, _) = self.cm_ud_qp(qpn)?;
        if qp_port != dport {
            return Err(RdmaError::bad(
                "bad_port",
                format!("{peer} is reached by port {dport}, and QP {qpn} is on port {qp_port}"),
            ));
        }
        let mut private = [0u8; dataplane::wire::cm::private_len::SIDR_REQ];
        CmaHeader {
            src_port: 32768 + (os_random() % 28232) as u16,
            src: local,
            dst: peer,
        }
        .emit(&mut private)
        .map_err(|e| RdmaError::internal("cm", e.to_string()))?;
        let pp = PeerPath {
            peer,
            local,
            peer_mac: mac.0,
            local_mac: self.macs[dport].0,
            vlan: vlan.map(|(vid, pcp)| dataplane::wire::eth::VlanTag {
                pcp,
                dei: false,
                vid,
            }),
        };
        let sid = CmSpace::Udp.service_id(port);
        let mut b = self.cm.book.lock().expect("cm book");
        let conn = self
            .ask(0, move |h, now| match h.gsi.as_mut() {
                Some(g) => {
                    g.learn(pp);
                    let r = g.cm.sidr_resolve(now, peer, sid, 0xffff, &private);
                    g.rearm();
                    r
                }
                None => Err(CmError::NoConn),
            })?
            .map_err(cm_error)?;
        b.conns.insert(
            conn.0,
            Conn {
                role: CmRole::Active,
                space: CmSpace::Udp,
                port,
                peer,
                peer_port: Some(port),
                qpn: Some(qpn),
                remote_qpn: None,
                remote_qkey: None,
                rep: None,
                phase: Phase::Resolving,
                since: Instant::now(),
            },
        );
        b.prune();
        drop(b);
        let what = format!("resolve udp {peer}:{port}");
        match self
            .cm
            .wait(conn.0, deadline, |p| matches!(p, Phase::Resolving))
        {
            Some(Phase::Resolved) => self.cm_connection(conn.0),
            Some(p) => Err(ended(p, &what)),
            None => {
                // The CM keeps asking until its own retries run out; nobody waits for it.
                self.cm_forget(conn.0, Phase::Unreachable);
                Err(timed_out(format!("{what}: no SIDR_REP in {wait:?}")))
            }
        }
    }

    /// Takes the oldest SIDR_REQ waiting on `port` (rdma_cm's UDP port space), waiting up to
    /// `wait` for one (or SIDR_REQ `which`), and answers it with UD QP `qpn` (brought to RTS if in RESET) and its
    /// Q_Key, as `rdma_accept` on a UD rdma_cm ID does.
    fn cm_accept_sidr(
        &self,
        (port, which): (u16, Option<u32>),
        qpn: u32,
        wait: Duration,
    ) -> Result<CmConnInfo, RdmaError> {
        let deadline = Instant::now() + wait.min(MAX_WAIT);
        let (qp_port, qkey) = self.cm_ud_qp(qpn)?;
        let (conn, _, peer) = self.cm_take((CmSpace::Udp, port, which), qpn, deadline, wait)?;
        let gsi_port = self.ask(0, |h, _| h.gsi.as_ref().map(|g| g.port()))?;
        if gsi_port != Some(qp_port) {
            self.cm.sidr_refuse(conn, SidrStatus::Rejected);
            self.cm_forget(conn, Phase::SidrRefused(SidrStatus::Rejected));
            return Err(RdmaError::bad(
                "bad_port",
                format!(
                    "QP {qpn} is on port {qp_port}, and the SIDR_REQ from {peer} came in on another"
                ),
            ));
        }
        let answered = self
            .ask(0, move |h, now| match h.gsi.as_mut() {
                Some(g) => {
                    let r =
                        g.cm.sidr_reply(now, ConnId(conn), SidrStatus::Ok, qpn, qkey);
                    g.rearm();
                    r
                }
                None => Err(CmError::NoConn),
            })?
            .map_err(cm_error);
        match answered {
            Ok(()) => {
                self.cm_forget(conn, Phase::Resolved);
                self.cm_connection(conn)
            }
            Err(e) => {
                self.cm_forget(conn, Phase::Gone);
                Err(e)
            }
        }
    }

    /// Disconnects connection `id` (a DREQ), moving its QP to ERR as `rdma_disconnect` does.
    /// Answers at once, as rdma_disconnect returns: the connection is "disconnecting" until
    /// the DREP comes (or the CM gives up on it), then "disconnected".
    pub fn cm_disconnect(&self, id: u32) -> Result<CmConnInfo, RdmaError> {
        let qpn = self.cm_connection(id)?.qpn;
        self.ask(0, move |h, now| match h.gsi.as_mut() {
            Some(g) => {
                let r = g.cm.disconnect(now, ConnId(id));
                g.rearm();
                r
            }
            None => Err(CmError::NoConn),
        })?
        .map_err(cm_error)?;
        if let Some(q) = qpn {
            self.cm.fail_qp(q);
        }
        {
            // Unless the DREP's event is in already.
            let mut b = self.cm.book.lock().expect("cm book");
            if b.conns
                .get(&id)
                .is_some_and(|c| matches!(c.phase, Phase::Established))
            {
                b.set(id, Phase::Disconnecting);
            }
        }
        self.cm_connection(id)
    }

    /// A connect that stopped waiting: its REQ is withdrawn (a REJ when the CM can send one)
    /// and the book forgets it.
    fn cm_give_up(&self, id: u32) {
        self.cm.reject(id, RejReason::Timeout);
        self.cm_forget(id, Phase::Rejected(RejReason::Timeout));
    }

    /// What an attached application hears when its connect or accept of connection `conn`
    /// (None: it never got that far) has ended, `result` as that call returned: established
    /// (with what the peer's REP said, for a connect), rejected (with the REJ's reason), no
    /// answer, or failed.
    pub fn cm_outcome(
        &self,
        conn: Option<u32>,
        result: &Result<CmConnInfo, RdmaError>,
    ) -> CmEventMsg {
        let b = self.cm.book.lock().expect("cm book");
        let c = conn.and_then(|id| b.conns.get(&id));
        let mut e = CmEventMsg {
            conn: conn.unwrap_or(0),
            ..Default::default()
        };
        match (result, c) {
            (Ok(info), c) => {
                e.kind = CmEventKind::Established;
                e.remote_qpn = info.remote_qpn.unwrap_or(0);
                e.qkey = info.remote_qkey.unwrap_or(0);
                if let Some(rep) = c.and_then(|c| c.rep) {
                    e.private_data = rep.private_data.to_vec();
                    e.responder_resources = rep.responder_resources;
                    e.initiator_depth = rep.initiator_depth;
                    e.rnr_retry_count = rep.rnr_retry_count;
                }
            }
            (Err(_), Some(c)) if matches!(c.phase, Phase::Rejected(_) | Phase::SidrRefused(_)) => {
                e.kind = CmEventKind::Rejected;
                e.status = match c.phase {
                    Phase::Rejected(r) => r.code() as i32,
                    Phase::SidrRefused(st) => st.code() as i32,
                    _ => 0,
                };
            }
            (Err(err), None) if err.code == "cm_rejected" => {
                e.kind = CmEventKind::Rejected;
            }
            (Err(err), _) if matches!(err.code, "cm_unreachable" | "timed_out") => {
                e.kind = CmEventKind::Unreachable;
                e.status = -libc::ETIMEDOUT;
            }
            (Err(_), _) => {
                e.kind = CmEventKind::ConnectError;
                e.status = -libc::ECONNREFUSED;
            }
        }
        e
    }

    /// Refuses request `conn` waiting on a listener of `space` (`rdma_reject`): a REJ
    /// (consumer reject), or a SIDR_REP with status "rejected".
    pub fn cm_reject(&self, conn: u32, space: CmSpace) -> Result<(), RdmaError> {
        let mut b = self.cm.book.lock().expect("cm book");
        if !b.pending(conn, space) {
            return Err(match b.conns.get(&conn) {
                Some(c) => RdmaError::conflict(
                    "bad_state",
                    format!(
                        "connection {conn} is {}, not a request waiting",
                        c.phase.name()
                    ),
                ),
                None => RdmaError::not_found(format!("no CM connection {conn}")),
            });
        }
        b.unqueue(conn);
        match space {
            CmSpace::Tcp => {
                b.set(conn, Phase::Rejected(RejReason::ConsumerReject));
                self.cm.reject(conn, RejReason::ConsumerReject);
            }
            CmSpace::Udp => {
                b.set(conn, Phase::SidrRefused(SidrStatus::Rejected));
                self.cm.sidr_refuse(conn, SidrStatus::Rejected);
            }
        }
        drop(b);
        self.cm.changed.notify_all();
        Ok(())
    }

    /// An attached application let go of connection `conn` (`rdma_destroy_id`): nothing more
    /// is told of it, and it is disconnected if still up, as rdma_cm does.
    pub fn cm_release(&self, conn: u32) {
        let phase = {
            let b = self.cm.book.lock().expect("cm book");
            b.conns.get(&conn).map(|c| (c.space, c.phase))
        };
        match phase {
            Some((space, Phase::Requested(_) | Phase::SidrRequested)) => {
                // Never accepted: refused, as rdma_cm refuses a child ID destroyed unaccepted.
                let _ = self.cm_reject(conn, space);
            }
            Some((_, Phase::Established)) => {
                let _ = self.cm_disconnect(conn);
            }
            _ => {}
        }
        let mut b = self.cm.book.lock().expect("cm book");
        b.conn_watch.remove(&conn);
    }

    /// Which application channel hears of connection `conn`: the connection's own watch, or
    /// for a request still waiting, its listener's.
    pub fn cm_owner(&self, conn: u32) -> Option<Arc<rustix::fd::OwnedFd>> {
        let b = self.cm.book.lock().expect("cm book");
        if let Some(w) = b.conn_watch.get(&conn) {
            return Some(w.sock.clone());
        }
        let c = b.conns.get(&conn)?;
        let waiting = b
            .listeners
            .get(&(c.space, c.port))
            .is_some_and(|(_, q)| q.contains(&conn));
        waiting
            .then(|| {
                b.listen_watch
                    .get(&(c.space, c.port))
                    .map(|w| w.sock.clone())
            })
            .flatten()
    }

    /// Which application channel hears of listener (`space`, `port`).
    pub fn cm_listener_owner(&self, space: CmSpace, port: u16) -> Option<Arc<rustix::fd::OwnedFd>> {
        let b = self.cm.book.lock().expect("cm book");
        b.listen_watch.get(&(space, port)).map(|w| w.sock.clone())
    }

    /// An attached application went: its listeners stop, its connections are let go
    /// ([`Rdma::cm_release`]); `socks` are its channels.
    pub fn cm_detach(&self, socks: &[Arc<rustix::fd::OwnedFd>]) {
        let mine = |w: &CmWatch| socks.iter().any(|s| Arc::ptr_eq(s, &w.sock));
        let (listens, conns): (Vec<_>, Vec<_>) = {
            let b = self.cm.book.lock().expect("cm book");
            (
                b.listen_watch
                    .iter()
                    .filter(|(_, w)| mine(w))
                    .map(|(k, _)| *k)
                    .collect(),
                b.conn_watch
                    .iter()
                    .filter(|(_, w)| mine(w))
                    .map(|(k, _)| *k)
                    .collect(),
            )
        };
        for (space, port) in listens {
            let _ = self.cm_unlisten(port, space);
        }
        for c in conns {
            self.cm_release(c);
        }
    }

    /// The device's address that reaches `peer` (`rdma_resolve_addr`).
    pub fn cm_resolve_addr(&self, peer: IpAddr) -> Result<IpAddr, RdmaError> {
        Ok(self.resolve(peer.to_canonical())?.1)
    }

    fn cm_forget(&self, id: u32, phase: Phase) {
        let mut b = self.cm.book.lock().expect("cm book");
        b.set(id, phase);
        drop(b);
        self.cm.changed.notify_all();
    }
}
