//! The attach socket: where local applications attach to roced and use it as their RDMA device
//! (issue 21).
//!
//! Each connection is a session on a thread of its own: control verbs come in as messages
//! ([`verbs::proto::Request`]), each answered by one [`verbs::proto::Reply`], with shared memory
//! passed as descriptors both ways: an application's memory to register (a sealed memfd), and
//! the rings roced makes for its CQs and QPs. A session owns what it creates: it may name only
//! its own PDs, CQs and QPs, and when the application closes the socket (or dies) everything it
//! created goes, QPs first (flushed), then completion rings, regions and PDs.

use crate::rdma::{CmOpts, CmSpace, CmWatch, MAX_BACKLOG, MAX_WAIT, Rdma, RdmaError, parse_gid};
use crate::state::ApiState;
use dataplane::cc::{CcKind, DcqcnParams};
use dataplane::host::{AppQueues, Fault};
use dataplane::transport::mr::Access;
use dataplane::transport::qp::{Mtu, Path, QpAttr, QpState, QpType};
use dataplane::transport::rc::QpCaps;
use rustix::fd::{AsFd, OwnedFd};
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use verbs::abi::{CQE_BYTES, RECV_HEADER, SEND_HEADER, SGE_BYTES};
use verbs::attach::{AttachError, recv, send};
use verbs::bell::{BELL_BYTES, BELL_QPS, Bells};
use verbs::event::EventKind;
use verbs::proto::{CmRequest, ModifyMsg, Reply, Request, RingPlace, VERSION};
use verbs::ring::{Consumer, HEADER, Producer, RingLayout};
use verbs::shm::SharedMem;

/// The live sessions: a handle on each one's socket (to end it) and its thread.
type Sessions = Arc<Mutex<Vec<(UnixStream, std::thread::JoinHandle<()>)>>>;

/// Binds the attach socket at `path` (its directory made if need be), gives it to `group` (if
/// given) and then permission bits `mode`: with 0660 and a group, that group's members attach;
/// with the default 0600, root only. A socket file left by a roced that is gone is replaced;
/// one a live roced answers on is not.
pub fn listen(
    path: &std::path::Path,
    mode: u32,
    group: Option<u32>,
) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is another live roced's attach socket", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    let own = || -> std::io::Result<()> {
        if let Some(g) = group {
            std::os::unix::fs::chown(path, None, Some(g)).map_err(|e| {
                std::io::Error::new(e.kind(), format!("giving it to group {g}: {e}"))
            })?;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    };
    if let Err(e) = own() {
        // Not left listening with the wrong owner or bits.
        drop(listener);
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(listener)
}

/// The running attach socket; [`AttachServer::stop`] ends it and its sessions.
#[derive(Debug)]
pub struct AttachServer {
    path: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    sessions: Sessions,
}

impl AttachServer {
    /// Listens at `path` with permission bits `mode`, owned by `group` if given (see
    /// [`listen`]).
    pub fn start(
        state: Arc<ApiState>,
        path: &std::path::Path,
        mode: u32,
        group: Option<u32>,
    ) -> std::io::Result<AttachServer> {
        let listener = listen(path, mode, group)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let sessions: Sessions = Arc::default();
        let thread = std::thread::Builder::new()
            .name("roced-attach".into())
            .spawn({
                let (stop, sessions) = (stop.clone(), sessions.clone());
                move || {
                    while !stop.load(Ordering::Relaxed) {
                        match listener.accept() {
                            Ok((s, _)) => {
                                let _ = s.set_nonblocking(false);
                                let Ok(mine) = s.try_clone() else { continue };
                                let st = state.clone();
                                match std::thread::Builder::new()
                                    .name("roced-session".into())
                                    .spawn(move || session(&st, s))
                                {
                                    Ok(t) => sessions.lock().expect("sessions").push((mine, t)),
                                    Err(e) => {
                                        tracing::error!("attach: no thread for a session: {e}")
                                    }
                                }
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            Err(e) => {
                                tracing::error!("attach socket: {e}");
                                std::thread::sleep(Duration::from_millis(200));
                            }
                        }
                        // Sessions that ended.
                        let mut s = sessions.lock().expect("sessions");
                        let (done, live): (Vec<_>, Vec<_>) =
                            s.drain(..).partition(|(_, t)| t.is_finished());
                        *s = live;
                        for (_, t) in done {
                            let _ = t.join();
                        }
                    }
                }
            })?;
        Ok(AttachServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
            sessions,
        })
    }

    /// Stops listening, ends every session (each destroys what its application created) and
    /// removes the socket file.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let sessions: Vec<_> = self.sessions.lock().expect("sessions").drain(..).collect();
        for (s, t) in sessions {
            let _ = s.shutdown(std::net::Shutdown::Both);
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What one application created.
#[derive(Debug, Default)]
struct Session {
    pid: u32,
    command: String,
    pds: Vec<u32>,
    mrs: Vec<u32>,
    /// Its CQs by their number in the session: (lcore, ring number there).
    cqs: BTreeMap<u32, (usize, u32)>,
    next_cq: u32,
    qps: Vec<u32>,
    /// Its address handles (numbers roced gave).
    ahs: Vec<u32>,
    /// Its doorbell memory (a region per lcore), made at Hello.
    bells: Option<Arc<SharedMem>>,
    /// By lcore: the number of its doorbell region there, once a QP of it lives there.
    bell_regions: BTreeMap<usize, u32>,
    /// roced's end of its asynchronous event socket, made at Hello.
    events: Option<OwnedFd>,
    /// Its QPs' and CQs' fault flags: the event a fault raises, what it names (the QP number,
    /// the CQ's number in the session), and the flag.
    faults: Vec<(EventKind, u32, Fault)>,
    /// Port 0's link as last seen (None before the first look).
    link: Option<bool>,
    /// roced's ends of its RDMA CM event channels, by number.
    channels: Vec<Arc<OwnedFd>>,
}

/// Event channels one application may have open.
const MAX_CHANNELS: usize = 1024;

/// Numbers sessions for the listing.
static SESSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn session(st: &Arc<ApiState>, sock: UnixStream) {
    let rdma = &st.rdma;
    let id = SESSIONS.fetch_add(1, Ordering::Relaxed);
    let mut s = Session::default();
    loop {
        // Between verbs, every tenth of a second: what to tell the application unasked.
        s.watch(st);
        match readable(&sock, Duration::from_millis(100)) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(_) => break,
        }
        let (req, fds) = match recv::<Request>(&sock) {
            Ok(m) => m,
            Err(AttachError::Closed) | Err(AttachError::Io(_)) => break,
            Err(e) => {
                // Bad bytes end the session: the stream cannot be trusted past them.
                let _ = send(&sock, &refusal("malformed", e.to_string()), &[]);
                break;
            }
        };
        let (reply, out) = s.handle(st, req, fds);
        if s.pid != 0 {
            let a = crate::state::AppListing {
                listing: s.listing(id),
                regions: s.bell_regions.iter().map(|(l, n)| (*l, *n)).collect(),
            };
            st.apps.lock().expect("applications").insert(id, a);
        }
        let borrowed: Vec<_> = out.iter().map(|f| f.as_fd()).collect();
        if send(&sock, &reply, &borrowed).is_err() {
            break;
        }
    }
    st.apps.lock().expect("applications").remove(&id);
    s.end(rdma);
}

/// True once `sock` has something to read (or has closed) within `wait`.
fn readable(sock: &UnixStream, wait: Duration) -> std::io::Result<bool> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut p = [PollFd::new(sock, PollFlags::IN)];
    let t = Timespec {
        tv_sec: wait.as_secs() as i64,
        tv_nsec: wait.subsec_nanos() as i64,
    };
    match poll(&mut p, Some(&t)) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn refusal(code: &str, message: impl Into<String>) -> Reply {
    Reply::Error {
        code: code.into(),
        message: message.into(),
    }
}

fn from_rdma(e: RdmaError) -> Reply {
    refusal(e.code, e.message)
}

/// `IBV_ACCESS_*` bits as the transport's access.
fn access_of(bits: u32) -> Result<Access, Reply> {
    Access::from_bits(bits)
        .ok_or_else(|| refusal("bad_access", format!("unknown access bits {bits:#x}")))
}

/// A ring layout for `entries` entries of `slot` bytes (rounded up as the rings need).
fn layout(entries: u32, slot: usize) -> Result<RingLayout, Reply> {
    let slots = entries
        .max(2)
        .checked_next_power_of_two()
        .unwrap_or(u32::MAX);
    RingLayout::new(slots, slot.next_multiple_of(8) as u32)
        .map_err(|e| refusal("bad_caps", e.to_string()))
}

impl Session {
    /// Tells the application, on its event socket, what happened to its objects since the last
    /// look: a QP or CQ the lcore abandoned for its rings' fault (`IBV_EVENT_QP_FATAL`,
    /// `IBV_EVENT_CQ_ERR`), port 0's link going down or up (`IBV_EVENT_PORT_ERR`,
    /// `IBV_EVENT_PORT_ACTIVE`). An event the socket has no room for is dropped (logged): an
    /// application that never reads them does not hold roced up.
    fn watch(&mut self, st: &ApiState) {
        let Some(fd) = &self.events else { return };
        let pid = self.pid;
        let tell = |kind, element| {
            let e = verbs::event::Event { kind, element };
            if !verbs::event::post(fd, e) {
                tracing::warn!(pid, event = ?kind, "application's event socket full: event dropped");
            }
        };
        // The lcore sets a flag once; taking it tells the fault once.
        for (kind, element, f) in &self.faults {
            if f.swap(false, Ordering::AcqRel) {
                let what = if *kind == EventKind::QpFatal {
                    "QP"
                } else {
                    "CQ"
                };
                tracing::warn!(
                    pid,
                    element,
                    "application {what} in error: its rings are corrupt"
                );
                tell(*kind, *element);
            }
        }
        let up = st
            .ports
            .lock()
            .expect("ports")
            .first()
            .and_then(|p| p["link_up"].as_bool());
        if let Some(up) = up {
            if self.link.is_some_and(|l| l != up) {
                let kind = if up {
                    EventKind::PortActive
                } else {
                    EventKind::PortErr
                };
                tell(kind, 1);
            }
            self.link = Some(up);
        }
    }

    /// What `GET /v1/apps` shows of it.
    fn listing(&self, id: u64) -> serde_json::Value {
        serde_json::json!({
            "id": id,
            "pid": self.pid,
            "command": self.command,
            "pds": self.pds,
            "mrs": self.mrs,
            "cqs": self.cqs.len(),
            "qps": self.qps,
            "ahs": self.ahs.len(),
        })
    }

    fn owns_pd(&self, pd: u32) -> Result<(), Reply> {
        if self.pds.contains(&pd) {
            Ok(())
        } else {
            Err(refusal("not_found", format!("no PD {pd}")))
        }
    }

    fn owns_qp(&self, qpn: u32) -> Result<(), Reply> {
        if self.qps.contains(&qpn) {
            Ok(())
        } else {
            Err(refusal("not_found", format!("no QP {qpn}")))
        }
    }

    fn handle(
        &mut self,
        st: &Arc<ApiState>,
        req: Request,
        fds: Vec<OwnedFd>,
    ) -> (Reply, Vec<OwnedFd>) {
        if self.pid == 0 && !matches!(req, Request::Hello { .. }) {
            return (refusal("hello_first", "say Hello first"), Vec::new());
        }
        let r = match req {
            Request::Cm(c) => self.cm_verb(st, c, fds).map(|r| (r, Vec::new())),
            req => self.verb(&st.rdma, req, fds),
        };
        match r {
            Ok(r) => r,
            Err(r) => (r, Vec::new()),
        }
    }

    fn verb(
        &mut self,
        rdma: &Rdma,
        req: Request,
        mut fds: Vec<OwnedFd>,
    ) -> Result<(Reply, Vec<OwnedFd>), Reply> {
        let done = |r: Reply| Ok((r, Vec::new()));
        match req {
            Request::Hello {
                version,
                pid,
                command,
            } => {
                if version != VERSION {
                    return Err(refusal(
                        "bad_version",
                        format!("this roced speaks attach protocol {VERSION}, not {version}"),
                    ));
                }
                let bytes = rdma.lcores().max(1) * BELL_BYTES;
                let bells = Arc::new(
                    SharedMem::create("ferroce-bells", bytes)
                        .map_err(|e| refusal("no_memory", e.to_string()))?,
                );
                let fd = bells
                    .fd()
                    .try_clone_to_owned()
                    .map_err(|e| refusal("internal", e.to_string()))?;
                let (mine, theirs) =
                    verbs::event::pair().map_err(|e| refusal("internal", e.to_string()))?;
                self.events = Some(mine);
                self.bells = Some(bells);
                self.pid = pid.max(1);
                self.command = command;
                tracing::info!(pid, command = %self.command, "application attached");
                Ok((
                    Reply::Welcome {
                        device: "ferroce0".into(),
                        gids: rdma.gids(0).iter().map(|g| g.to_string()).collect(),
                        mtu: rdma.port_mtu(0).into(),
                        mac: rdma.mac(0).map_or([0; 6], |m| m.0),
                        bells: bytes,
                    },
                    vec![fd, theirs],
                ))
            }
            Request::AllocPd => {
                let pd = rdma.alloc_pd().map_err(from_rdma)?;
                self.pds.push(pd.pdn);
                done(Reply::Pd { pd: pd.pdn })
            }
            Request::DeallocPd { pd } => {
                self.owns_pd(pd)?;
                rdma.dealloc_pd(pd).map_err(from_rdma)?;
                self.pds.retain(|&p| p != pd);
                done(Reply::Done)
            }
            Request::RegMr {
                pd,
                addr,
                length,
                offset,
                pieces,
                access,
            } => {
                self.owns_pd(pd)?;
                let access = access_of(access)?;
                let bad = |e: verbs::shm::ShmError| refusal("bad_memory", e.to_string());
                let m = if pieces.is_empty() {
                    let Some(fd) = fds.pop() else {
                        return Err(refusal("no_memory", "RegMr comes with the memory's memfd"));
                    };
                    let end = offset
                        .checked_add(length)
                        .ok_or_else(|| refusal("bad_memory", "offset + length overflows"))?;
                    SharedMem::map(fd, end).map_err(bad)?
                } else {
                    if fds.len() != pieces.len() {
                        return Err(refusal(
                            "no_memory",
                            format!("{} pieces with {} memfds", pieces.len(), fds.len()),
                        ));
                    }
                    let p: Vec<_> = fds
                        .iter()
                        .zip(&pieces)
                        .map(|(f, p)| (f.as_fd(), p.offset, p.len))
                        .collect();
                    SharedMem::map_pieces(&p).map_err(bad)?
                };
                let mem = dataplane::mem::SharedMem::application(Arc::new(m), offset, length)
                    .ok_or_else(|| refusal("bad_memory", "the range is outside the memory"))?;
                let mr = rdma.reg_app_mr(mem, addr, access, pd).map_err(from_rdma)?;
                self.mrs.push(mr.lkey);
                done(Reply::Mr {
                    lkey: mr.lkey,
                    rkey: mr.rkey,
                })
            }
            Request::DeregMr { lkey } => {
                if !self.mrs.contains(&lkey) {
                    return Err(refusal("not_found", format!("no memory region {lkey:#x}")));
                }
                rdma.dereg_mr(lkey).map_err(from_rdma)?;
                self.mrs.retain(|&k| k != lkey);
                done(Reply::Done)
            }
            Request::CreateCq { cqe, channel } => {
                let event = if channel {
                    let fd = fds.pop().ok_or_else(|| {
                        refusal("no_channel", "a CQ with a channel comes with its eventfd")
                    })?;
                    // The lcore writes it: anything that could block (a full pipe, a socket)
                    // would stall every QP of the lcore.
                    let what = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                        .map(|p| p.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    if what != "anon_inode:[eventfd]" {
                        return Err(refusal(
                            "bad_channel",
                            format!("a completion channel is an eventfd, not {what:?}"),
                        ));
                    }
                    Some(fd)
                } else {
                    None
                };
                let l = layout(cqe, CQE_BYTES)?;
                let mem = Arc::new(
                    SharedMem::create("ferroce-cq", l.bytes())
                        .map_err(|e| refusal("no_memory", e.to_string()))?,
                );
                let ring = Producer::new(mem.clone(), 0, l)
                    .map_err(|e| refusal("internal", e.to_string()))?;
                let fault = Fault::default();
                let (lcore, n) = rdma
                    .add_app_cq(None, ring, event, fault.clone())
                    .map_err(from_rdma)?;
                let cq = self.next_cq;
                self.next_cq += 1;
                self.cqs.insert(cq, (lcore, n));
                self.faults.push((EventKind::CqErr, cq, fault));
                let fd = mem
                    .fd()
                    .try_clone_to_owned()
                    .map_err(|e| refusal("internal", e.to_string()))?;
                Ok((
                    Reply::Cq {
                        cq,
                        bytes: l.bytes(),
                        ring: RingPlace {
                            offset: 0,
                            slots: l.slots,
                            slot_size: l.slot_size,
                        },
                    },
                    vec![fd],
                ))
            }
            Request::DestroyCq { cq } => {
                let &(lcore, n) = self
                    .cqs
                    .get(&cq)
                    .ok_or_else(|| refusal("not_found", format!("no CQ {cq}")))?;
                rdma.remove_app_cq(lcore, n).map_err(from_rdma)?;
                self.cqs.remove(&cq);
                self.faults.retain(|f| (f.0, f.1) != (EventKind::CqErr, cq));
                done(Reply::Done)
            }
            Request::CreateAh { pd, gid } => {
                self.owns_pd(pd)?;
                let gid = parse_gid(&gid).map_err(from_rdma)?;
                let ah = rdma.add_app_ah(pd, gid).map_err(from_rdma)?;
                self.ahs.push(ah);
                done(Reply::Ah { ah })
            }
            Request::DestroyAh { ah } => {
                if !self.ahs.contains(&ah) {
                    return Err(refusal("not_found", format!("no address handle {ah}")));
                }
                rdma.remove_app_ah(ah);
                self.ahs.retain(|&a| a != ah);
                done(Reply::Done)
            }
            Request::CreateQp {
                pd,
                send_cq,
                recv_cq,
                caps,
                ud,
            } => {
                self.owns_pd(pd)?;
                let cq = |c: u32| {
                    self.cqs
                        .get(&c)
                        .copied()
                        .ok_or_else(|| refusal("not_found", format!("no CQ {c}")))
                };
                let ((sl, sn), (rl, rn)) = (cq(send_cq)?, cq(recv_cq)?);
                if sl != rl {
                    return Err(refusal(
                        "bad_cq",
                        "a QP's send and receive CQs must live on the same lcore",
                    ));
                }
                let sq = layout(
                    caps.max_send_wr,
                    SEND_HEADER
                        + (caps.max_send_sge as usize * SGE_BYTES)
                            .max(caps.max_inline_data as usize),
                )?;
                let rq = layout(
                    caps.max_recv_wr,
                    RECV_HEADER + caps.max_recv_sge as usize * SGE_BYTES,
                )?;
                let qcaps = QpCaps {
                    max_send_wr: sq.slots,
                    max_recv_wr: rq.slots,
                    max_send_sge: caps.max_send_sge,
                    max_recv_sge: caps.max_recv_sge,
                    max_inline_data: caps.max_inline_data,
                    qp_type: if ud { QpType::Ud } else { QpType::Rc },
                    ..QpCaps::default()
                };
                let placement = crate::rdma::QpPlacement {
                    pd: Some(pd),
                    cqs: [None; 2],
                };
                let (qpn, _, sq_psn) = rdma
                    .create_qp(
                        Some(sl),
                        qcaps,
                        placement,
                        CcKind::Dcqcn,
                        DcqcnParams::nvidia(),
                    )
                    .map_err(from_rdma)?;
                let rq_at = sq.bytes().next_multiple_of(64);
                let bytes = rq_at + rq.bytes();
                let bells = match self.bell_regions.get(&sl) {
                    Some(&n) => n,
                    None => {
                        let mem = self.bells.clone().expect("made at Hello");
                        let region = Bells::new(mem, sl * BELL_BYTES).ok_or_else(|| {
                            refusal("internal", format!("no doorbell region for lcore {sl}"))
                        });
                        let n = match region.map(|r| rdma.add_app_bells(sl, r).map_err(from_rdma)) {
                            Ok(Ok(n)) => n,
                            Ok(Err(e)) | Err(e) => {
                                let _ = rdma.destroy_qp(qpn);
                                return Err(e);
                            }
                        };
                        self.bell_regions.insert(sl, n);
                        n
                    }
                };
                let fault = Fault::default();
                let rings = (|| {
                    let mem = Arc::new(
                        SharedMem::create("ferroce-qp", bytes).map_err(|e| e.to_string())?,
                    );
                    let q = AppQueues {
                        qpn,
                        sq: Consumer::new(mem.clone(), 0, sq).map_err(|e| e.to_string())?,
                        rq: Consumer::new(mem.clone(), rq_at, rq).map_err(|e| e.to_string())?,
                        send_cq: sn,
                        recv_cq: rn,
                        pd,
                        bells,
                        fault: fault.clone(),
                    };
                    let fd = mem.fd().try_clone_to_owned().map_err(|e| e.to_string())?;
                    Ok::<_, String>((q, fd))
                })();
                let (q, fd) = match rings {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = rdma.destroy_qp(qpn);
                        return Err(refusal("no_memory", e));
                    }
                };
                let bit = match rdma.attach_app_qp(q) {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = rdma.destroy_qp(qpn);
                        return Err(from_rdma(e));
                    }
                };
                self.qps.push(qpn);
                self.faults.push((EventKind::QpFatal, qpn, fault));
                Ok((
                    Reply::Qp {
                        qpn,
                        bytes,
                        sq: RingPlace {
                            offset: 0,
                            slots: sq.slots,
                            slot_size: sq.slot_size,
                        },
                        rq: RingPlace {
                            offset: rq_at,
                            slots: rq.slots,
                            slot_size: rq.slot_size,
                        },
                        sq_psn,
                        bell: sl as u32 * BELL_QPS + bit,
                    },
                    vec![fd],
                ))
            }
            Request::ModifyQp { qpn, attr } => {
                self.owns_qp(qpn)?;
                let a = qp_attr(&attr)?;
                rdma.modify_qp(qpn, &a, 0).map_err(from_rdma)?;
                done(Reply::Done)
            }
            Request::QueryQp { qpn } => {
                self.owns_qp(qpn)?;
                let (_, q) = rdma.query_qp(qpn).map_err(from_rdma)?;
                done(Reply::QpState {
                    state: q.cfg.state.name().into(),
                    sq_psn: q.cfg.sq_psn.value(),
                    rq_psn: q.cfg.rq_psn.value(),
                })
            }
            Request::Cm(c) => Err(refusal("internal", format!("{c:?} is a CM verb"))),
            Request::DestroyQp { qpn } => {
                self.owns_qp(qpn)?;
                rdma.destroy_qp(qpn).map_err(from_rdma)?;
                self.qps.retain(|&q| q != qpn);
                self.faults
                    .retain(|f| (f.0, f.1) != (EventKind::QpFatal, qpn));
                done(Reply::Done)
            }
        }
    }

    /// The channel numbered `n`.
    fn channel(&self, n: u32) -> Result<Arc<OwnedFd>, Reply> {
        self.channels
            .get(n as usize)
            .cloned()
            .ok_or_else(|| refusal("not_found", format!("no event channel {n}")))
    }

    /// Whether `sock` is one of its channels' (what it may name of the CM's).
    fn owns_channel(&self, sock: Option<Arc<OwnedFd>>) -> bool {
        sock.is_some_and(|s| self.channels.iter().any(|c| Arc::ptr_eq(c, &s)))
    }

    fn owns_conn(&self, rdma: &Rdma, conn: u32) -> Result<(), Reply> {
        if self.owns_channel(rdma.cm_owner(conn)) {
            Ok(())
        } else {
            Err(refusal("not_found", format!("no CM connection {conn}")))
        }
    }

    /// The RDMA CM's verbs. Those that wait on the peer (a connect, an accept's RTU) answer at
    /// once and go on on a thread of their own, which tells how they ended on the channel.
    fn cm_verb(
        &mut self,
        st: &Arc<ApiState>,
        req: CmRequest,
        mut fds: Vec<OwnedFd>,
    ) -> Result<Reply, Reply> {
        let rdma = &st.rdma;
        let space = |udp: bool| if udp { CmSpace::Udp } else { CmSpace::Tcp };
        let ip = |s: &str| parse_gid(s).map_err(|e| refusal("bad_address", format!("{s}: {e}")));
        match req {
            CmRequest::Channel => {
                if fds.len() != 1 {
                    return Err(refusal("bad_request", "CmChannel comes with one socket"));
                }
                if self.channels.len() >= MAX_CHANNELS {
                    return Err(refusal(
                        "exhausted",
                        format!("{MAX_CHANNELS} event channels at most"),
                    ));
                }
                self.channels.push(Arc::new(fds.remove(0)));
                Ok(Reply::CmChannel {
                    channel: (self.channels.len() - 1) as u32,
                })
            }
            CmRequest::ResolveAddr { peer } => {
                let local = rdma.cm_resolve_addr(ip(&peer)?).map_err(from_rdma)?;
                Ok(Reply::CmAddr {
                    local: local.to_string(),
                })
            }
            CmRequest::Listen {
                channel,
                id,
                udp,
                port,
                backlog,
            } => {
                let w = CmWatch {
                    sock: self.channel(channel)?,
                    id,
                };
                let backlog = (backlog as usize).clamp(1, MAX_BACKLOG);
                rdma.cm_listen_for(port, space(udp), backlog, Some(w))
                    .map_err(from_rdma)?;
                Ok(Reply::Done)
            }
            CmRequest::Unlisten { udp, port } => {
                if !self.owns_channel(rdma.cm_listener_owner(space(udp), port)) {
                    return Err(refusal(
                        "not_found",
                        format!("no listener of yours on port {port}"),
                    ));
                }
                rdma.cm_unlisten(port, space(udp)).map_err(from_rdma)?;
                Ok(Reply::Done)
            }
            CmRequest::Connect {
                channel,
                id,
                qpn,
                udp,
                peer,
                port,
                private_data,
                responder_resources,
                initiator_depth,
                retry_count,
                rnr_retry_count,
            } => {
                self.owns_qp(qpn)?;
                let w = CmWatch {
                    sock: self.channel(channel)?,
                    id,
                };
                let peer = ip(&peer)?;
                let o = CmOpts {
                    private_data,
                    responder_resources,
                    initiator_depth,
                    retry_count: Some(retry_count),
                    rnr_retry_count: Some(rnr_retry_count),
                    watch: Some(w.clone()),
                };
                let st = st.clone();
                std::thread::Builder::new()
                    .name("cm-connect".into())
                    .spawn(move || {
                        let (conn, r) = if udp {
                            let r = st.rdma.cm_resolve(qpn, peer, port, MAX_WAIT);
                            (r.as_ref().ok().map(|c| c.id), r)
                        } else {
                            st.rdma.cm_connect_with((qpn, peer, port), MAX_WAIT, &o)
                        };
                        if let Err(e) = &r {
                            tracing::info!(qpn, %peer, port, "application's CM connect: {e}");
                        }
                        w.tell(st.rdma.cm_outcome(conn, &r));
                    })
                    .map_err(|e| refusal("internal", e.to_string()))?;
                Ok(Reply::Done)
            }
            CmRequest::Accept {
                channel,
                id,
                conn,
                udp,
                port,
                qpn,
                private_data,
                responder_resources,
                initiator_depth,
            } => {
                self.owns_qp(qpn)?;
                self.owns_conn(rdma, conn)?;
                let w = CmWatch {
                    sock: self.channel(channel)?,
                    id,
                };
                let o = CmOpts {
                    private_data,
                    responder_resources,
                    initiator_depth,
                    watch: Some(w.clone()),
                    ..Default::default()
                };
                if udp {
                    rdma.cm_accept_with((port, CmSpace::Udp, Some(conn)), qpn, Duration::ZERO, &o)
                        .map_err(from_rdma)?;
                    return Ok(Reply::Done);
                }
                let c = rdma.cm_connection(conn).map_err(from_rdma)?;
                if c.state != "requested" || c.port != port {
                    return Err(refusal(
                        "bad_state",
                        format!(
                            "connection {conn} is {}, not a request waiting on port {port}",
                            c.state
                        ),
                    ));
                }
                let st = st.clone();
                std::thread::Builder::new()
                    .name("cm-accept".into())
                    .spawn(move || {
                        let r = st.rdma.cm_accept_with(
                            (port, CmSpace::Tcp, Some(conn)),
                            qpn,
                            MAX_WAIT,
                            &o,
                        );
                        if let Err(e) = &r {
                            tracing::info!(qpn, conn, "application's CM accept: {e}");
                        }
                        w.tell(st.rdma.cm_outcome(Some(conn), &r));
                    })
                    .map_err(|e| refusal("internal", e.to_string()))?;
                Ok(Reply::Done)
            }
            CmRequest::Reject { conn, udp } => {
                self.owns_conn(rdma, conn)?;
                rdma.cm_reject(conn, space(udp)).map_err(from_rdma)?;
                Ok(Reply::Done)
            }
            CmRequest::Disconnect { conn } => {
                self.owns_conn(rdma, conn)?;
                rdma.cm_disconnect(conn).map_err(from_rdma)?;
                Ok(Reply::Done)
            }
            CmRequest::Release { conn } => {
                self.owns_conn(rdma, conn)?;
                rdma.cm_release(conn);
                Ok(Reply::Done)
            }
        }
    }

    /// The application went away: everything it made goes, QPs first.
    fn end(self, rdma: &Rdma) {
        rdma.cm_detach(&self.channels);
        for q in &self.qps {
            let _ = rdma.destroy_qp(*q);
        }
        for (lcore, n) in self.cqs.values() {
            let _ = rdma.remove_app_cq(*lcore, *n);
        }
        for (lcore, n) in &self.bell_regions {
            rdma.remove_app_bells(*lcore, *n);
        }
        for a in &self.ahs {
            rdma.remove_app_ah(*a);
        }
        for k in &self.mrs {
            let _ = rdma.dereg_mr(*k);
        }
        for p in &self.pds {
            let _ = rdma.dealloc_pd(*p);
        }
        if self.pid != 0 {
            tracing::info!(
                pid = self.pid,
                command = %self.command,
                qps = self.qps.len(),
                mrs = self.mrs.len(),
                cqs = self.cqs.len(),
                "application detached: its resources are gone"
            );
        }
    }
}

/// A modify's attributes as the engine's: the state, and what was given.
fn qp_attr(m: &ModifyMsg) -> Result<QpAttr, Reply> {
    let state = match m.state.as_str() {
        "INIT" => QpState::Init,
        "RTR" => QpState::Rtr,
        "RTS" => QpState::Rts,
        "SQD" => QpState::Sqd,
        "ERR" => QpState::Err,
        "RESET" => QpState::Reset,
        s => {
            return Err(refusal(
                "bad_attr",
                format!("state {s:?}: INIT, RTR, RTS, SQD, ERR or RESET"),
            ));
        }
    };
    let mtu = match m.mtu {
        Some(b) => Some(Mtu::from_bytes(b).ok_or_else(|| {
            refusal(
                "bad_attr",
                format!("mtu must be 256, 512, 1024, 2048 or 4096, not {b}"),
            )
        })?),
        None => None,
    };
    let path = match &m.remote_gid {
        Some(g) => Some(Path::toward(
            parse_gid(g).map_err(from_rdma)?,
            m.dscp.unwrap_or(26),
        )),
        None => None,
    };
    Ok(QpAttr {
        state: Some(state),
        access: m.access.map(access_of).transpose()?,
        pkey_index: None,
        path_mtu: mtu,
        dest_qp: m.dest_qp,
        rq_psn: m.rq_psn,
        sq_psn: m.sq_psn,
        timeout: m.timeout,
        retry_cnt: m.retry_cnt,
        rnr_retry: m.rnr_retry,
        min_rnr_timer: m.min_rnr_timer,
        max_rd_atomic: m.max_rd_atomic,
        max_dest_rd_atomic: m.max_dest_rd_atomic,
        path,
        qkey: m.qkey,
    })
}

// The header offset the layouts above assume.
const _: () = assert!(HEADER.is_multiple_of(64));

#[cfg(test)]
mod tests {
    use super::listen;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;

    /// Connects to `path` as user nobody with primary group `gid` (no other groups): whether
    /// the kernel let it.
    fn connects_as_nobody(path: &std::path::Path, gid: u32) -> bool {
        std::process::Command::new("python3")
            .args([
                "-c",
                "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])",
            ])
            .arg(path)
            .uid(65534)
            .gid(gid)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("python3 runs")
            .success()
    }

    #[test]
    fn the_attach_socket_admits_its_group_and_no_one_else() {
        let dir = std::env::temp_dir().join(format!("ferroce-attach-group-{}", std::process::id()));
        let path = dir.join("a.sock");
        // Group daemon (1), which nobody is not in, may attach; nobody's own group may not.
        let l = listen(&path, 0o660, Some(1)).expect("listen");
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!((m.gid(), m.permissions().mode() & 0o777), (1, 0o660));
        assert!(
            connects_as_nobody(&path, 1),
            "a member of the socket's group was refused"
        );
        assert!(
            !connects_as_nobody(&path, 65534),
            "a process outside the group attached"
        );
        drop(l);
        // The default: root's group, 0600: nobody attaches, whatever its group.
        let l = listen(&path, 0o600, None).expect("listen again over the stale socket");
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!((m.gid(), m.permissions().mode() & 0o777), (0, 0o600));
        assert!(
            !connects_as_nobody(&path, 1),
            "0600 admitted a process not root"
        );
        drop(l);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
