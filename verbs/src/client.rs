//! The client library: a process attaches to roced's socket and uses ferroce as its RDMA device.
//! Control verbs are messages on the socket; posting and polling are the rings, with no system
//! call (roced's lcore polls them).
//!
//! ```no_run
//! use verbs::client::{Context, Memory};
//! let ctx = Context::attach("/run/ferroce/ferroce.sock".as_ref())?;
//! let pd = ctx.alloc_pd()?;
//! let mem = Memory::new(1 << 20)?;
//! let (lkey, _rkey) = ctx.reg_mr(pd, &mem, 0xf)?;
//! let cq = ctx.create_cq(256)?;
//! # Ok::<(), verbs::client::ClientError>(())
//! ```

use crate::abi::{self, Cqe, RecvWqe, SendWqe};
use crate::attach::{AttachError, recv, send};
use crate::bell::{BELL_BYTES, BELL_QPS, Bell};
use crate::proto::{ModifyMsg, QpCapsMsg, Reply, Request, RingPlace, VERSION};
use crate::ring::{Consumer, Producer, RingError, RingLayout};
use crate::shm::{SharedMem, ShmError};
use rustix::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// Why a verb failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket.
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// roced refused, with its code.
    #[error("{code}: {message}")]
    Refused {
        /// Stable code.
        code: String,
        /// For people.
        message: String,
    },
    /// roced answered something else than the verb's reply.
    #[error("unexpected reply: {0}")]
    Unexpected(String),
    /// Shared memory.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// A ring.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// An entry.
    #[error(transparent)]
    Abi(#[from] abi::AbiError),
    /// The process's memory could not be shared.
    #[error(transparent)]
    Adopt(#[from] crate::adopt::AdoptError),
    /// A range outside the memory.
    #[error("{len} bytes at {off} are outside {size} bytes of memory")]
    OutOfRange {
        /// Offset asked.
        off: usize,
        /// Length asked.
        len: usize,
        /// The memory's length.
        size: usize,
    },
}

/// Memory an application registers: a sealed memfd mapped here, which roced maps too and its
/// lcores read and write in place. Its address is what work requests name.
#[derive(Debug)]
pub struct Memory {
    mem: SharedMem,
}

impl Memory {
    /// `len` zeroed bytes.
    pub fn new(len: usize) -> Result<Memory, ClientError> {
        Ok(Memory {
            mem: SharedMem::create("ferroce-mr", len)?,
        })
    }

    /// The address work requests name for its first byte.
    pub fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn check(&self, off: usize, len: usize) -> Result<(), ClientError> {
        if off.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(ClientError::OutOfRange {
                off,
                len,
                size: self.len(),
            });
        }
        Ok(())
    }

    /// Copies `data` in at `off`.
    pub fn write(&self, off: usize, data: &[u8]) -> Result<(), ClientError> {
        self.check(off, data.len())?;
        // SAFETY: inside the mapping (checked); a copy from a distinct buffer. The lcores may
        // write the same bytes at once only if the application let a peer do so.
        unsafe {
            core::ptr::copy_nonoverlapping(data.as_ptr(), self.mem.as_ptr().add(off), data.len())
        };
        Ok(())
    }

    /// Copies `len` bytes out from `off`.
    pub fn read(&self, off: usize, len: usize) -> Result<Vec<u8>, ClientError> {
        self.check(off, len)?;
        let mut v = vec![0u8; len];
        // SAFETY: inside the mapping (checked); a copy into a distinct buffer.
        unsafe { core::ptr::copy_nonoverlapping(self.mem.as_ptr().add(off), v.as_mut_ptr(), len) };
        Ok(v)
    }
}

/// A completion queue: its ring, read here.
#[derive(Debug)]
pub struct Cq {
    /// Its number in the session.
    pub cq: u32,
    ring: Consumer,
    place: RingPlace,
}

impl Cq {
    /// The memory its ring lives in, and where (as [`Qp::raw_rings`]).
    pub fn raw_ring(&self) -> (&Arc<SharedMem>, RingPlace) {
        (self.ring.memory(), self.place)
    }

    /// Arms the CQ (`ibv_req_notify_cq`): roced writes its channel's eventfd at the next
    /// completion. Poll once more after arming.
    pub fn arm(&self) {
        self.ring.arm();
    }

    /// True while armed and not yet notified.
    pub fn armed(&self) -> bool {
        self.ring.armed()
    }

    /// The next completion, if there is one.
    pub fn poll_one(&mut self) -> Result<Option<Cqe>, ClientError> {
        let mut b = [0u8; abi::CQE_BYTES];
        Ok(self.ring.pop_array(&mut b)?.then(|| Cqe::decode(&b)))
    }

    /// Entries the ring holds.
    pub fn capacity(&self) -> u32 {
        self.ring.layout().slots
    }

    /// Up to `max` completions into `out` (`ibv_poll_cq`); how many.
    pub fn poll(&mut self, max: usize, out: &mut Vec<Cqe>) -> Result<usize, ClientError> {
        let mut b = [0u8; abi::CQE_BYTES];
        let mut n = 0;
        while n < max && self.ring.pop_array(&mut b)? {
            out.push(Cqe::decode(&b));
            n += 1;
        }
        Ok(n)
    }
}

/// A queue pair: its send and receive rings, written here.
#[derive(Debug)]
pub struct Qp {
    /// Its number.
    pub qpn: u32,
    /// The PSN it starts sending with (what the peer's modify to RTR needs).
    pub sq_psn: u32,
    sq: Producer,
    rq: Producer,
    bell: Bell,
    bit: u32,
    /// Where the rings lie in their memory.
    places: (RingPlace, RingPlace),
}

impl Qp {
    /// Posts a send work request (`ibv_post_send`); Ok(false) if the send queue is full.
    pub fn post_send(&mut self, w: &SendWqe<'_>) -> Result<bool, ClientError> {
        let pushed = put(&mut self.sq, true, |slot| w.encode(slot))?;
        if pushed {
            self.bell.ring(self.bit);
        }
        Ok(pushed)
    }

    /// Writes a send work request into the send queue without publishing it (see
    /// [`Producer::stage`]); Ok(false) if the send queue is full.
    pub fn stage_send(&mut self, w: &SendWqe<'_>) -> Result<bool, ClientError> {
        put(&mut self.sq, false, |slot| w.encode(slot))
    }

    /// Publishes the staged send work requests: the lcore takes them from now on.
    pub fn publish_sends(&mut self) {
        if self.sq.staged() > 0 {
            self.sq.publish();
            self.bell.ring(self.bit);
        }
    }

    /// Forgets the staged send work requests.
    pub fn discard_sends(&mut self) {
        self.sq.discard();
    }

    /// The memory its rings live in, and where its send and receive rings lie in it. Writing
    /// there behind the library's back is what a buggy or hostile program can do (roced's tests
    /// do it, to see that only this QP suffers); the library's own indices are then stale.
    pub fn raw_rings(&self) -> (&Arc<SharedMem>, RingPlace, RingPlace) {
        (self.sq.memory(), self.places.0, self.places.1)
    }

    /// Rings the QP's doorbell without posting anything.
    pub fn ring_doorbell(&self) {
        self.bell.ring(self.bit);
    }

    /// Entries of the send and the receive queue.
    pub fn depths(&self) -> (u32, u32) {
        (self.sq.layout().slots, self.rq.layout().slots)
    }

    /// Posts a receive (`ibv_post_recv`); Ok(false) if the receive queue is full.
    pub fn post_recv(&mut self, r: &RecvWqe) -> Result<bool, ClientError> {
        let pushed = put(&mut self.rq, true, |slot| r.encode(slot))?;
        if pushed {
            self.bell.ring(self.bit);
        }
        Ok(pushed)
    }
}

/// Encodes an entry where it goes in `ring`, published (`publish`) or staged; Ok(false) if the
/// ring is full, and nothing written if it does not encode.
fn put(
    ring: &mut Producer,
    publish: bool,
    encode: impl FnOnce(&mut [u8]) -> Result<usize, abi::AbiError>,
) -> Result<bool, ClientError> {
    let mut bad = None;
    let fill = |slot: &mut [u8]| match encode(slot) {
        Ok(_) => true,
        Err(e) => {
            bad = Some(e);
            false
        }
    };
    let done = if publish {
        ring.push_with(fill)
    } else {
        ring.stage_with(fill)
    }?;
    match bad {
        Some(e) => Err(e.into()),
        None => Ok(done),
    }
}

/// An attachment to roced.
#[derive(Debug)]
pub struct Context {
    sock: UnixStream,
    /// The device's name.
    pub device: String,
    /// Port 0's GIDs.
    pub gids: Vec<String>,
    /// Port 0's MTU.
    pub mtu: u32,
    /// Port 0's MAC address.
    pub mac: [u8; 6],
    /// The doorbell memory (a region per lcore).
    bells: Option<Arc<SharedMem>>,
    /// The application's end of the asynchronous event socket.
    events: Option<OwnedFd>,
}

fn ring_of<T>(
    mem: &Arc<SharedMem>,
    p: RingPlace,
    make: impl FnOnce(Arc<SharedMem>, usize, RingLayout) -> Result<T, RingError>,
) -> Result<T, ClientError> {
    Ok(make(
        mem.clone(),
        p.offset,
        RingLayout::new(p.slots, p.slot_size)?,
    )?)
}

impl Context {
    /// Attaches to the roced listening at `path`.
    pub fn attach(path: &std::path::Path) -> Result<Context, ClientError> {
        let sock = UnixStream::connect(path).map_err(AttachError::Io)?;
        // Something that is not roced (another program's socket) may never answer: the
        // greeting has a deadline; the verbs after it wait as long as roced takes.
        sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .map_err(AttachError::Io)?;
        let mut c = Context {
            sock,
            device: String::new(),
            gids: Vec::new(),
            mtu: 0,
            mac: [0; 6],
            bells: None,
            events: None,
        };
        let command = std::env::args().next().unwrap_or_default();
        match c.call(
            &Request::Hello {
                version: VERSION,
                pid: std::process::id(),
                command,
            },
            &[],
        )? {
            (
                Reply::Welcome {
                    device,
                    gids,
                    mtu,
                    mac,
                    bells,
                },
                mut fds,
            ) if fds.len() == 2 => {
                c.events = fds.pop();
                c.bells = Some(Arc::new(SharedMem::map(fds.remove(0), bells)?));
                c.device = device;
                c.gids = gids;
                c.mtu = mtu;
                c.mac = mac;
                c.sock.set_read_timeout(None).map_err(AttachError::Io)?;
                Ok(c)
            }
            (r, _) => Err(ClientError::Unexpected(format!("{r:?}"))),
        }
    }

    fn call(
        &self,
        req: &Request,
        fds: &[rustix::fd::BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>), ClientError> {
        send(&self.sock, req, fds)?;
        match recv::<Reply>(&self.sock)? {
            (Reply::Error { code, message }, _) => Err(ClientError::Refused { code, message }),
            r => Ok(r),
        }
    }

    /// One of the RDMA CM's verbs, with `fds`: roced's reply (a refusal as
    /// [`ClientError::Refused`]); their replies carry no descriptors.
    pub fn cm(
        &self,
        req: crate::proto::CmRequest,
        fds: &[rustix::fd::BorrowedFd<'_>],
    ) -> Result<Reply, ClientError> {
        Ok(self.call(&Request::Cm(req), fds)?.0)
    }

    fn done(&self, req: &Request) -> Result<(), ClientError> {
        match self.call(req, &[])? {
            (Reply::Done, _) => Ok(()),
            (r, _) => Err(ClientError::Unexpected(format!("{r:?}"))),
        }
    }

    /// The asynchronous event socket's descriptor (libibverbs' `async_fd`): readable while
    /// events wait.
    pub fn async_fd(&self) -> Option<rustix::fd::BorrowedFd<'_>> {
        self.events.as_ref().map(|f| f.as_fd())
    }

    /// The next asynchronous event, waiting at most `wait` (None: until one comes); once roced
    /// has gone, `IBV_EVENT_DEVICE_FATAL`.
    pub fn async_event(
        &self,
        wait: Option<std::time::Duration>,
    ) -> Result<Option<crate::event::Event>, ClientError> {
        let Some(fd) = &self.events else {
            return Ok(None);
        };
        use crate::event::{Event, EventKind, Read};
        match crate::event::read(fd, wait).map_err(AttachError::Io)? {
            Read::Event(e) => Ok(Some(e)),
            Read::Gone => Ok(Some(Event {
                kind: EventKind::DeviceFatal,
                element: 0,
            })),
            Read::Nothing => Ok(None),
        }
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<u32, ClientError> {
        match self.call(&Request::AllocPd, &[])? {
            (Reply::Pd { pd }, _) => Ok(pd),
            (r, _) => Err(ClientError::Unexpected(format!("{r:?}"))),
        }
    }

    /// `ibv_reg_mr` of all of `mem` with `IBV_ACCESS_*` bits `access`: (lkey, rkey).
    pub fn reg_mr(&self, pd: u32, mem: &Memory, access: u32) -> Result<(u32, u32), ClientError> {
        let req = Request::RegMr {
            pd,
            addr: mem.addr(),
            length: mem.len(),
            offset: 0,
            pieces: Vec::new(),
            access,
        };
        match self.call(&req, &[mem.mem.fd()])? {
            (Reply::Mr { lkey, rkey }, _) => Ok((lkey, rkey)),
            (r, _) => Err(ClientError::Unexpected(format!("{r:?}"))),
        }
    }

    /// `ibv_reg_mr` of `len` bytes of this process's own memory at `addr` (any memory:
    /// malloc's, the stack, static data), made shareable in place first ([`crate::adopt`]):
    /// (lkey, rkey).
    ///
    /// # Safety
    /// As [`crate::adopt::adopt`]: the range is this process's memory and no other thread
    /// writes it while this runs.
    pub unsafe fn reg_mr_at(
        &self,
        pd: u32,
        addr: usize,
        len: usize,
        access: u32,
    ) -> Result<(u32, u32), ClientError> {
        // SAFETY: the caller's contract.
        unsafe { self.reg_mr_at_iova(pd, addr, len, addr as u64, access) }
    }

    /// [`Context::reg_mr_at`] of a region that work requests name by `iova` instead of its
    /// address (`ibv_reg_mr_iova2`).
    ///
    /// # Safety
    /// As [`Context::reg_mr_at`].
    pub unsafe fn reg_mr_at_iova(
        &self,
        pd: u32,
        addr: usize,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Result<(u32, u32), ClientError> {
        // SAFETY: the caller's contract is adopt's.
        let a = unsafe { crate::adopt::adopt(addr, len) }?;
        if a.pieces.len() > crate::attach::MAX_FDS {
            return Err(ClientError::Unexpected(format!(
                "the region spans {} runs of pages adopted apart, more than {} in one message",
                a.pieces.len(),
                crate::attach::MAX_FDS
            )));
        }
        let req = Request::RegMr {
            pd,
            addr: iova,
            length: len,
            offset: a.offset,
            pieces: a
                .pieces
                .iter()
                .map(|p| crate::proto::PieceMsg {
                    offset: p.offset,
                    len: p.len,
                })
                .collect(),
            access,
        };
        let fds: Vec<_> = a.pieces.iter().map(|p| p.fd.as_fd()).collect();
        match self.call(&req, &fds)? {
            (Reply::Mr { lkey, rkey }, _) => Ok((lkey, rkey)),
            (r, _) => Err(ClientError::Unexpected(format!("{r:?}"))),
        }
    }

    /// `ibv_dereg_mr` of the region with local key `lkey`.
    pub fn dereg_mr(&self, lkey: u32) -> Result<(), ClientError> {
        self.done(&Request::DeregMr { lkey })
    }

    /// `ibv_dealloc_pd`.
    pub fn dealloc_pd(&self, pd: u32) -> Result<(), ClientError> {
        self.done(&Request::DeallocPd { pd })
    }

    /// `ibv_destroy_cq`.
    pub fn destroy_cq(&self, cq: Cq) -> Result<(), ClientError> {
        self.destroy_cq_id(cq.cq)
    }

    /// `ibv_destroy_cq` of CQ `cq` (its ring is the caller's to drop).
    pub fn destroy_cq_id(&self, cq: u32) -> Result<(), ClientError> {
        self.done(&Request::DestroyCq { cq })
    }

    /// `ibv_create_cq` of at least `cqe` entries.
    pub fn create_cq(&self, cqe: u32) -> Result<Cq, ClientError> {
        self.create_cq_with(cqe, None)
    }

    /// [`Context::create_cq`] with a completion channel: `event`, an eventfd, is written when
    /// a completion arrives on the CQ while it is armed ([`Cq::arm`]).
    pub fn create_cq_with(
        &self,
        cqe: u32,
        event: Option<rustix::fd::BorrowedFd<'_>>,
    ) -> Result<Cq, ClientError> {
        let req = Request::CreateCq {
            cqe,
            channel: event.is_some(),
        };
        let fds: Vec<_> = event.into_iter().collect();
        match self.call(&req, &fds)? {
            (Reply::Cq { cq, bytes, ring }, mut fds) if fds.len() == 1 => {
                let mem = Arc::new(SharedMem::map(fds.remove(0), bytes)?);
                Ok(Cq {
                    cq,
                    ring: ring_of(&mem, ring, Consumer::new)?,
                    place: ring,
                })
            }
            (r, _) => Err(ClientError::Unexpected(format!("{r:?}"))),
        }
    }

    /// `ibv_create_qp` (RC) in `pd`, completing into `send_cq` and `recv_cq`.
    pub fn create_qp(
        &self,
        pd: u32,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCapsMsg,
    ) -> Result<Qp, ClientError> {
        self.create_qp_in(pd, send_cq.cq, recv_cq.cq, caps, false)
    }

    /// `ibv_create_ah` in `pd` toward `gid`: its number, for [`crate::abi::UdTarget::ah`].
    pub fn create_ah(&self, pd: u32, gid: &str) -> Result<u32, ClientError> {
        let req = Request::CreateAh {
            pd,
            gid: gid.into(),
        };
        match self.call(&req, &[])? {
            (Reply::Ah { ah }, _) => Ok(ah),
            (r, _) => Err(ClientError::Unexpected(format!("{r:?}"))),
        }
    }

    /// `ibv_destroy_ah`.
    pub fn destroy_ah(&self, ah: u32) -> Result<(), ClientError> {
        self.done(&Request::DestroyAh { ah })
    }

    /// [`Context::create_qp`] naming the CQs by number, RC or UD.
    pub fn create_qp_in(
        &self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCapsMsg,
        ud: bool,
    ) -> Result<Qp, ClientError> {
        let req = Request::CreateQp {
            pd,
            send_cq,
            recv_cq,
            caps,
            ud,
        };
        match self.call(&req, &[])? {
            (
                Reply::Qp {
                    qpn,
                    bytes,
                    sq,
                    rq,
                    sq_psn,
                    bell,
                },
                mut fds,
            ) if fds.len() == 1 => {
                let mem = Arc::new(SharedMem::map(fds.remove(0), bytes)?);
                let bells = self.bells.clone().expect("attached with doorbells");
                let region = (bell / BELL_QPS) as usize * BELL_BYTES;
                let bell_of = Bell::new(bells, region)
                    .ok_or_else(|| ClientError::Unexpected(format!("doorbell {bell}")))?;
                Ok(Qp {
                    qpn,
                    sq_psn,
                    sq: ring_of(&mem, sq, Producer::new)?,
                    rq: ring_of(&mem, rq, Producer::new)?,
                    bell: bell_of,
                    bit: bell % BELL_QPS,
                    places: (sq, rq),
                })
            }
            (r, _) => Err(ClientError::Unexpected(format!("{r:?}"))),
        }
    }

    /// `ibv_modify_qp`.
    pub fn modify_qp(&self, qp: &Qp, attr: ModifyMsg) -> Result<(), ClientError> {
        self.modify_qp_num(qp.qpn, attr)
    }

    /// `ibv_modify_qp` of QP `qpn`.
    pub fn modify_qp_num(&self, qpn: u32, attr: ModifyMsg) -> Result<(), ClientError> {
        self.done(&Request::ModifyQp { qpn, attr })
    }

    /// `ibv_query_qp` of QP `qpn`: (state, send PSN, receive PSN).
    pub fn query_qp(&self, qpn: u32) -> Result<(String, u32, u32), ClientError> {
        match self.call(&Request::QueryQp { qpn }, &[])? {
            (
                Reply::QpState {
                    state,
                    sq_psn,
                    rq_psn,
                },
                _,
            ) => Ok((state, sq_psn, rq_psn)),
            (r, _) => Err(ClientError::Unexpected(format!("{r:?}"))),
        }
    }

    /// `ibv_destroy_qp`.
    pub fn destroy_qp(&self, qp: Qp) -> Result<(), ClientError> {
        self.destroy_qp_num(qp.qpn)
    }

    /// `ibv_destroy_qp` of QP `qpn` (its rings are the caller's to drop).
    pub fn destroy_qp_num(&self, qpn: u32) -> Result<(), ClientError> {
        self.done(&Request::DestroyQp { qpn })
    }

    /// The doorbell memory roced gave at attach (a region per lcore; see [`crate::bell`]).
    pub fn doorbell_memory(&self) -> Option<&Arc<SharedMem>> {
        self.bells.as_ref()
    }

    /// The socket, for a caller that waits on it.
    pub fn socket(&self) -> rustix::fd::BorrowedFd<'_> {
        self.sock.as_fd()
    }
}
