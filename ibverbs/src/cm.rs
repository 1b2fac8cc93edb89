//! librdmacm in front of ferroce: the `rdma_*` calls of an unmodified rdma_cm program (rping,
//! ucmatose, udaddy, rdma_server/rdma_client, perftest's `-R`) answered with roced's CM
//! through the attach socket, beside this library's verbs.
//!
//! How the pieces map. An event channel is a `SOCK_SEQPACKET` socket pair made here: the
//! program's `rdma_event_channel.fd` is one end, readable while events wait, as librdmacm's is;
//! the other end goes to roced ([`verbs::proto::CmRequest::Channel`]) the first time an ID of
//! the channel uses a device, and roced writes the events of that ID's listener or connection
//! on it (a REQ came, the RTU came, a REJ, a DREQ or DREP). The events of address and route
//! resolution, which need no peer, are written on it here. A device is opened once per process
//! and shared by every ID on it (`rdma_cm_id.verbs`), as librdmacm does; the ID's QP is made
//! with this library's verbs in that context, so roced can check it is the program's own.
//!
//! What follows librdmacm (rdma-core 44, `librdmacm/cma.c`): a QP made by `rdma_create_qp`
//! is moved to INIT (RC) or to RTS with rdma_cm's Q_Key (UD), with CQs made for it when the
//! program gives none; an ID made without a channel is synchronous (each call waits for its
//! own event); `rdma_get_request` gives a new ID with a QP as the listening endpoint's
//! attributes say; the child of a CONNECT_REQUEST shares its listener's channel and context.
//!
//! Not offered (an error with a line on stderr, never the real librdmacm behind it):
//! multicast, SRQs made through the CM, ECE, `rdma_migrate_id`, `rdma_init_qp_attr` and
//! `rdma_establish` (for programs that move their own QPs), the IB and IPoIB port spaces.

use crate::device::{Ctx, ctx};
use crate::sys::*;
use crate::{Fail, Res, minus_one_call, ptr_call};
use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Mutex, MutexGuard};
use verbs::proto::{CmEventKind, CmEventMsg, CmRequest, Reply};

/// rdma_cm's Q_Key for UD QPs of its UDP port space (`RDMA_UDP_QKEY`).
const UDP_QKEY: u32 = 0x0123_4567;
/// Bytes of private data an event may carry (a REP's 196 at most).
const PRIVATE_MAX: usize = 256;
/// Requests a listener holds unaccepted when the program says none (librdmacm's default).
const DEFAULT_BACKLOG: u32 = 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Devices.

/// The contexts opened for the CM, one per device (never closed, as librdmacm's).
static CONTEXTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// The PD made for a context when `rdma_create_qp` is given none.
static DEFAULT_PDS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// Every ferroce device, opened.
fn contexts() -> Res<Vec<&'static Ctx>> {
    let mut open = lock(&CONTEXTS);
    if open.is_empty() {
        for d in crate::device::enumerate() {
            let c = crate::device::ibv_open_device(&d.dev as *const ibv_device as *mut ibv_device);
            if !c.is_null() {
                open.push(c as usize);
            }
        }
    }
    if open.is_empty() {
        return Err(Fail::new(
            libc::ENODEV,
            "no ferroce device: is roced running (FERROCE_SOCKET, /run/ferroce)?",
        ));
    }
    // Contexts opened for the CM are never closed: theirs is the process's lifetime.
    open.iter()
        .map(|&c| ctx::<'static>(c as *mut ibv_context))
        .collect()
}

/// The GID of an address, as a GID table holds it.
fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The device that owns `ip` (any device for a wildcard).
fn context_for(ip: IpAddr) -> Res<&'static Ctx> {
    let all = contexts()?;
    if ip.is_unspecified() {
        return Ok(all[0]);
    }
    let g = gid_of(ip.to_canonical());
    all.into_iter()
        .find(|c| c.gids.contains(&g))
        .ok_or_else(|| {
            Fail::new(
                libc::EADDRNOTAVAIL,
                format!("{ip} is no address of a ferroce device"),
            )
        })
}

fn default_pd(x: &Ctx) -> Res<*mut ibv_pd> {
    let mut pds = lock(&DEFAULT_PDS);
    let key = x.ibv() as usize;
    if let Some((_, pd)) = pds.iter().find(|(c, _)| *c == key) {
        return Ok(*pd as *mut ibv_pd);
    }
    let pd = crate::mr::ibv_alloc_pd(x.ibv());
    if pd.is_null() {
        return Err(Fail::new(libc::ENOMEM, "no PD for the CM's QP"));
    }
    pds.push((key, pd as usize));
    Ok(pd)
}

// ---------------------------------------------------------------------------------------------
// Addresses.

/// The address a `sockaddr` holds (IPv4 or IPv6).
fn sockaddr_in(sa: *const sockaddr) -> Res<SocketAddr> {
    // SAFETY: the caller's sockaddr, read as its family says.
    unsafe {
        let sa = sa.cast::<libc::sockaddr>();
        let sa = sa.as_ref().ok_or_else(|| Fail::inval("no address"))?;
        match sa.sa_family as c_int {
            libc::AF_INET => {
                let s = &*(sa as *const libc::sockaddr as *const libc::sockaddr_in);
                Ok(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                    u16::from_be(s.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const libc::sockaddr as *const libc::sockaddr_in6);
                Ok(SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                    u16::from_be(s.sin6_port),
                ))
            }
            f => Err(Fail::new(
                libc::EAFNOSUPPORT,
                format!("address family {f}: IPv4 or IPv6"),
            )),
        }
    }
}

/// Writes `a` as a `sockaddr_in` or `sockaddr_in6` at `dst` (room for a `sockaddr_storage`).
fn put_sockaddr(dst: *mut c_void, a: SocketAddr) {
    // SAFETY: `dst` is a sockaddr_storage's room (the route's unions, an addrinfo's buffer).
    unsafe {
        core::ptr::write_bytes(dst.cast::<u8>(), 0, size_of::<libc::sockaddr_in6>());
        match a {
            SocketAddr::V4(v) => {
                let s = &mut *dst.cast::<libc::sockaddr_in>();
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = v.port().to_be();
                s.sin_addr.s_addr = u32::from(*v.ip()).to_be();
            }
            SocketAddr::V6(v) => {
                let s = &mut *dst.cast::<libc::sockaddr_in6>();
                s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                s.sin6_port = v.port().to_be();
                s.sin6_addr.s6_addr = v.ip().octets();
            }
        }
    }
}

fn sockaddr_len(a: SocketAddr) -> usize {
    match a {
        SocketAddr::V4(_) => size_of::<libc::sockaddr_in>(),
        SocketAddr::V6(_) => size_of::<libc::sockaddr_in6>(),
    }
}

/// `ip` in the family of `like` (an IPv4 peer's local address as IPv4).
fn same_family(ip: IpAddr, like: IpAddr) -> IpAddr {
    match (ip.to_canonical(), like) {
        (IpAddr::V4(a), IpAddr::V6(_)) => IpAddr::V6(a.to_ipv6_mapped()),
        (a, _) => a,
    }
}

fn parse_ip(s: &str) -> Res<IpAddr> {
    s.parse::<IpAddr>()
        .map(|a| a.to_canonical())
        .map_err(|_| Fail::new(libc::EPROTO, format!("roced gave {s:?} as an address")))
}

// ---------------------------------------------------------------------------------------------
// Event channels.

/// An event channel: `ch.fd` is the program's end.
#[repr(C)]
pub(crate) struct Channel {
    ch: rdma_event_channel,
    mine: OwnedFd,
    /// The end roced and this library write events on.
    feed: OwnedFd,
    /// The channel's number in each context's session it was given to: (context, number).
    on: Mutex<Vec<(usize, u32)>>,
}

impl Channel {
    fn new() -> Res<Box<Channel>> {
        let (mine, feed) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| Fail::new(e.raw_os_error(), format!("no socket pair: {e}")))?;
        // The feed never waits: a program that never reads its channel loses events.
        rustix::fs::fcntl_setfl(&feed, rustix::fs::OFlags::NONBLOCK)
            .map_err(|e| Fail::new(e.raw_os_error(), e.to_string()))?;
        Ok(Box::new(Channel {
            ch: rdma_event_channel {
                fd: mine.as_raw_fd(),
            },
            mine,
            feed,
            on: Mutex::new(Vec::new()),
        }))
    }

    /// Its number in `x`'s session, giving roced its end the first time.
    fn number_in(&self, x: &Ctx) -> Res<u32> {
        let mut on = lock(&self.on);
        let key = x.ibv() as usize;
        if let Some((_, n)) = on.iter().find(|(c, _)| *c == key) {
            return Ok(*n);
        }
        let fd = self.feed.as_fd();
        match x.with(|c| c.cm(CmRequest::Channel, &[fd]))? {
            Reply::CmChannel { channel } => {
                on.push((key, channel));
                Ok(channel)
            }
            r => Err(Fail::new(libc::EPROTO, format!("roced answered {r:?}"))),
        }
    }

    /// Writes an event of this library's own (address and route resolution).
    fn post(&self, e: &CmEventMsg) -> Res<()> {
        if verbs::proto::post_cm_event(&self.feed, e) {
            Ok(())
        } else {
            Err(Fail::new(
                libc::ENOBUFS,
                "the event channel is full: the program does not read its events",
            ))
        }
    }
}

fn channel<'a>(c: *mut rdma_event_channel) -> Res<&'a Channel> {
    // SAFETY: every channel handed out is the first field of a live Channel.
    unsafe { (c as *const Channel).as_ref() }.ok_or_else(|| Fail::inval("no event channel"))
}

/// `rdma_create_event_channel`.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ptr_call("rdma_create_event_channel", || {
        Ok(Box::leak(Channel::new()?) as *mut Channel as *mut rdma_event_channel)
    })
}

/// `rdma_destroy_event_channel`.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_event_channel(c: *mut rdma_event_channel) {
    if !c.is_null() {
        // SAFETY: the Channel rdma_create_event_channel leaked; given back once.
        drop(unsafe { Box::from_raw(c as *mut Channel) });
    }
}

// ---------------------------------------------------------------------------------------------
// IDs.

/// What the library knows of an ID beyond `rdma_cm_id`.
#[derive(Default)]
struct IdState {
    /// rdma_cm's UDP port space (UD), else TCP (RC).
    udp: bool,
    /// Its own address (bound, resolved, or where a request came).
    local: Option<SocketAddr>,
    /// The peer's (resolved, or a request's source).
    peer: Option<SocketAddr>,
    /// It listens (on `local`'s port).
    listening: bool,
    /// Its connection in roced.
    conn: Option<u32>,
    /// CQs and completion channels `rdma_create_qp` made for it, destroyed with it.
    made: Vec<Made>,
    /// The path record `rdma_resolve_route` filled (`route.path_rec` points at it).
    path: Option<Box<ibv_sa_path_rec>>,
    /// A listening endpoint's QP attributes and PD (`rdma_create_ep`): what
    /// `rdma_get_request` makes each new ID's QP with.
    ep_qp: Option<(ibv_qp_init_attr, usize)>,
}

enum Made {
    Cq(usize),
    Channel(usize),
}

/// An ID: `id` is what the program holds.
#[repr(C)]
pub(crate) struct Id {
    id: rdma_cm_id,
    st: Mutex<IdState>,
    /// The channel of a synchronous ID (made without one), its own.
    own: Option<Box<Channel>>,
}

/// The IDs alive, so that an event for one destroyed since is dropped, not followed.
static IDS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn live(p: usize) -> bool {
    lock(&IDS).as_ref().is_some_and(|s| s.contains(&p))
}

fn id<'a>(p: *mut rdma_cm_id) -> Res<&'a Id> {
    if p.is_null() || !live(p as usize) {
        return Err(Fail::inval("no such rdma_cm ID"));
    }
    // SAFETY: a live ID is the first field of a leaked Id.
    Ok(unsafe { &*(p as *const Id) })
}

impl Id {
    fn new(ch: *mut rdma_event_channel, context: *mut c_void, ps: u32) -> Res<*mut Id> {
        let udp = match ps {
            rdma_port_space::RDMA_PS_TCP => false,
            rdma_port_space::RDMA_PS_UDP => true,
            _ => {
                return Err(Fail::unsupported(&format!(
                    "port space {ps:#x} (the TCP and UDP port spaces are)"
                )));
            }
        };
        let own = if ch.is_null() {
            Some(Channel::new()?)
        } else {
            None
        };
        // SAFETY: rdma_cm_id is C data of pointers, integers and unions of them; zeroes are
        // valid (NULL, 0).
        let zero: rdma_cm_id = unsafe { core::mem::zeroed() };
        let mut x = Box::new(Id {
            id: zero,
            st: Mutex::new(IdState {
                udp,
                ..Default::default()
            }),
            own,
        });
        x.id.channel = match &x.own {
            Some(c) => &c.ch as *const rdma_event_channel as *mut rdma_event_channel,
            None => ch,
        };
        x.id.context = context;
        x.id.ps = ps;
        x.id.qp_type = if udp {
            ibv_qp_type::IBV_QPT_UD
        } else {
            ibv_qp_type::IBV_QPT_RC
        };
        let p = Box::leak(x) as *mut Id;
        lock(&IDS)
            .get_or_insert_with(HashSet::new)
            .insert(p as usize);
        Ok(p)
    }

    fn raw(&self) -> *mut rdma_cm_id {
        &self.id as *const rdma_cm_id as *mut rdma_cm_id
    }

    fn st(&self) -> MutexGuard<'_, IdState> {
        lock(&self.st)
    }

    fn channel(&self) -> Res<&Channel> {
        channel(self.id.channel)
    }

    fn sync(&self) -> bool {
        self.own.is_some()
    }

    /// Its context (once bound or resolved).
    fn ctx(&self) -> Res<&'static Ctx> {
        if self.id.verbs.is_null() {
            return Err(Fail::inval(
                "the ID has no device yet: bind or resolve an address first",
            ));
        }
        // Contexts opened for the CM are never closed.
        ctx::<'static>(self.id.verbs)
    }

    /// Puts it on device `x` with `local` as its address.
    fn bind(&self, x: &Ctx, local: SocketAddr) {
        let me = self.raw();
        // SAFETY: the program's ID; the library owns its fields.
        unsafe {
            (*me).verbs = x.ibv();
            (*me).port_num = 1;
            put_sockaddr(
                core::ptr::addr_of_mut!((*me).route.addr.__bindgen_anon_1).cast(),
                local,
            );
            (*me).route.addr.addr.ibaddr.sgid.raw = gid_of(local.ip());
            (*me).route.addr.addr.ibaddr.pkey = 0xffffu16.to_be();
        }
        self.st().local = Some(local);
    }

    fn set_peer(&self, peer: SocketAddr) {
        let me = self.raw();
        // SAFETY: as in `bind`.
        unsafe {
            put_sockaddr(
                core::ptr::addr_of_mut!((*me).route.addr.__bindgen_anon_2).cast(),
                peer,
            );
            (*me).route.addr.addr.ibaddr.dgid.raw = gid_of(peer.ip());
        }
        self.st().peer = Some(peer);
    }

    /// A synchronous ID's call waits for its event, which must be `want`; it stays the ID's
    /// `event` until the next one (as librdmacm's `ucma_complete`).
    fn complete(&self, want: CmEventKind) -> Res<()> {
        let Some(own) = &self.own else {
            return Ok(());
        };
        let e = next_event(own)?;
        // SAFETY: the event just made.
        let (kind, status) = unsafe { ((*e).ev.event, (*e).ev.status) };
        self.keep_event(e);
        if kind == event_type(want) {
            Ok(())
        } else {
            let errno = match kind {
                rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => libc::ECONNREFUSED,
                rdma_cm_event_type::RDMA_CM_EVENT_UNREACHABLE => libc::ETIMEDOUT,
                _ if status < 0 => -status,
                _ => libc::EIO,
            };
            Err(Fail::new(
                errno,
                format!(
                    "{} instead of {} (status {status})",
                    event_name(kind),
                    event_name(event_type(want))
                ),
            ))
        }
    }

    /// Makes `e` the ID's `event`, acknowledging the one before.
    fn keep_event(&self, e: *mut Ev) {
        let me = self.raw();
        // SAFETY: the program's ID; its event is one this library made.
        unsafe {
            let old = (*me).event;
            (*me).event = e as *mut rdma_cm_event;
            if !old.is_null() {
                drop(Box::from_raw(old as *mut Ev));
            }
        }
    }
}

/// `rdma_create_id`.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_id(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space::Type,
) -> c_int {
    minus_one_call("rdma_create_id", || {
        if out.is_null() {
            return Err(Fail::inval("no place for the ID"));
        }
        let p = Id::new(ch, context, ps)?;
        // SAFETY: the caller's pointer.
        unsafe { *out = p as *mut rdma_cm_id };
        Ok(())
    })
}

/// `rdma_destroy_id`: stops listening, lets go of the connection (disconnected if still up),
/// and destroys what `rdma_create_qp` made for it.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_id(p: *mut rdma_cm_id) -> c_int {
    minus_one_call("rdma_destroy_id", || {
        let x = id(p)?;
        lock(&IDS)
            .get_or_insert_with(HashSet::new)
            .remove(&(p as usize));
        let (listening, conn, udp, local, made) = {
            let mut st = x.st();
            (
                st.listening,
                st.conn,
                st.udp,
                st.local,
                std::mem::take(&mut st.made),
            )
        };
        if let Ok(c) = x.ctx() {
            if listening && let Some(l) = local {
                let _ = c.with(|s| {
                    s.cm(
                        CmRequest::Unlisten {
                            udp,
                            port: l.port(),
                        },
                        &[],
                    )
                });
            }
            if let Some(conn) = conn {
                let _ = c.with(|s| s.cm(CmRequest::Release { conn }, &[]));
            }
        }
        // CQs before the completion channels they use.
        for m in made.into_iter().rev() {
            match m {
                Made::Cq(cq) => {
                    crate::cq::ibv_destroy_cq(cq as *mut ibv_cq);
                }
                Made::Channel(ch) => {
                    crate::cq::ibv_destroy_comp_channel(ch as *mut ibv_comp_channel);
                }
            }
        }
        x.keep_event(core::ptr::null_mut());
        // SAFETY: the Id rdma_create_id leaked; no longer live, freed once.
        drop(unsafe { Box::from_raw(p as *mut Id) });
        Ok(())
    })
}

/// `rdma_bind_addr`: the device that owns the address (any, for a wildcard) and its port.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_bind_addr(p: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    minus_one_call("rdma_bind_addr", || {
        let x = id(p)?;
        let a = sockaddr_in(addr)?;
        let c = context_for(a.ip())?;
        let a = if a.port() == 0 {
            SocketAddr::new(a.ip(), ephemeral_port())
        } else {
            a
        };
        x.bind(c, a);
        Ok(())
    })
}

/// A port for an ID bound to port 0 (as the kernel's ephemeral range).
fn ephemeral_port() -> u16 {
    let mut b = [0u8; 2];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    32768 + (u16::from_ne_bytes(b) % 28232)
}

/// `rdma_listen`: requests that come are CONNECT_REQUEST events on the ID's channel.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_listen(p: *mut rdma_cm_id, backlog: c_int) -> c_int {
    minus_one_call("rdma_listen", || {
        let x = id(p)?;
        if x.id.verbs.is_null() {
            let any = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), ephemeral_port());
            x.bind(context_for(any.ip())?, any);
        }
        let c = x.ctx()?;
        let n = x.channel()?.number_in(c)?;
        let (udp, local) = {
            let st = x.st();
            (st.udp, st.local.expect("bound"))
        };
        let backlog = if backlog <= 0 {
            DEFAULT_BACKLOG
        } else {
            backlog as u32
        };
        c.with(|s| {
            s.cm(
                CmRequest::Listen {
                    channel: n,
                    id: p as u64,
                    udp,
                    port: local.port(),
                    backlog,
                },
                &[],
            )
        })?;
        x.st().listening = true;
        Ok(())
    })
}

/// `rdma_resolve_addr`: which device and address reach `dst` (roced's routes and neighbour
/// table), told as ADDR_RESOLVED (or ADDR_ERROR) on the ID's channel.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_resolve_addr(
    p: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    minus_one_call("rdma_resolve_addr", || {
        let x = id(p)?;
        let peer = sockaddr_in(dst)?;
        let src = if src.is_null() {
            None
        } else {
            Some(sockaddr_in(src)?)
        };
        let candidates = match src {
            Some(s) if !s.ip().is_unspecified() => vec![context_for(s.ip())?],
            _ => contexts()?,
        };
        let mut why = String::new();
        let mut found = None;
        for c in candidates {
            match c.with(|s| {
                s.cm(
                    CmRequest::ResolveAddr {
                        peer: peer.ip().to_string(),
                    },
                    &[],
                )
            }) {
                Ok(Reply::CmAddr { local }) => {
                    found = Some((c, parse_ip(&local)?));
                    break;
                }
                Ok(r) => why = format!("roced answered {r:?}"),
                Err(e) => why = e.msg,
            }
        }
        let ch = x.channel()?;
        let Some((c, local)) = found else {
            eprintln!("ferroce: rdma_resolve_addr: {}: {why}", peer.ip());
            ch.post(&CmEventMsg {
                kind: CmEventKind::AddrError,
                id: p as u64,
                status: -libc::EHOSTUNREACH,
                ..Default::default()
            })?;
            return x.complete(CmEventKind::AddrResolved);
        };
        let port = src.map_or(0, |s| s.port());
        let port = if port == 0 { ephemeral_port() } else { port };
        x.bind(c, SocketAddr::new(same_family(local, peer.ip()), port));
        x.set_peer(peer);
        ch.post(&CmEventMsg {
            kind: CmEventKind::AddrResolved,
            id: p as u64,
            ..Default::default()
        })?;
        x.complete(CmEventKind::AddrResolved)
    })
}

/// `rdma_resolve_route`: RoCE needs no path query; the path record is filled from the
/// addresses and ROUTE_RESOLVED told.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_resolve_route(p: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    minus_one_call("rdma_resolve_route", || {
        let x = id(p)?;
        let c = x.ctx()?;
        let (local, peer) = {
            let st = x.st();
            (st.local, st.peer)
        };
        let (Some(local), Some(peer)) = (local, peer) else {
            return Err(Fail::inval("resolve the address first"));
        };
        // SAFETY: ibv_sa_path_rec is plain C data; zeroes are valid.
        let mut rec: Box<ibv_sa_path_rec> = Box::new(unsafe { core::mem::zeroed() });
        rec.sgid.raw = gid_of(local.ip());
        rec.dgid.raw = gid_of(peer.ip());
        rec.pkey = 0xffffu16.to_be();
        rec.hop_limit = 64;
        rec.mtu = crate::device::active_mtu(c.mtu) as u8;
        rec.reversible = 1;
        rec.numb_path = 1;
        let at = &mut *rec as *mut ibv_sa_path_rec;
        x.st().path = Some(rec);
        // SAFETY: the program's ID; the record lives as long as it.
        unsafe {
            (*p).route.path_rec = at;
            (*p).route.num_paths = 1;
        }
        x.channel()?.post(&CmEventMsg {
            kind: CmEventKind::RouteResolved,
            id: p as u64,
            ..Default::default()
        })?;
        x.complete(CmEventKind::RouteResolved)
    })
}

// ---------------------------------------------------------------------------------------------
// QPs.

fn modify(qp: *mut ibv_qp, a: &mut ibv_qp_attr, mask: u32) -> Res<()> {
    match crate::qp::ibv_modify_qp(qp, a, mask as c_int) {
        0 => Ok(()),
        e => Err(Fail::new(e, "moving the CM's QP")),
    }
}

/// Makes the ID's QP as librdmacm's `rdma_create_qp_ex` does.
fn create_qp(x: &Id, pd: *mut ibv_pd, a: &mut ibv_qp_init_attr) -> Res<()> {
    use ibv_qp_attr_mask::*;
    let c = x.ctx()?;
    if !x.id.qp.is_null() {
        return Err(Fail::inval("the ID has a QP already"));
    }
    let pd = if pd.is_null() {
        if x.id.pd.is_null() {
            default_pd(c)?
        } else {
            x.id.pd
        }
    } else {
        pd
    };
    let me = x.raw();
    let mut made = Vec::new();
    let mut cq_for =
        |depth: u32, chan: *mut *mut ibv_comp_channel, cq: *mut *mut ibv_cq| -> Res<*mut ibv_cq> {
            let ch = crate::cq::ibv_create_comp_channel(c.ibv());
            if ch.is_null() {
                return Err(Fail::new(
                    libc::ENOMEM,
                    "no completion channel for the CM's QP",
                ));
            }
            made.push(Made::Channel(ch as usize));
            let q = crate::cq::ibv_create_cq(c.ibv(), depth.max(1) as c_int, me.cast(), ch, 0);
            if q.is_null() {
                return Err(Fail::new(libc::ENOMEM, "no CQ for the CM's QP"));
            }
            made.push(Made::Cq(q as usize));
            // SAFETY: the program's ID.
            unsafe {
                *chan = ch;
                *cq = q;
            }
            Ok(q)
        };
    let r = (|| {
        // SAFETY: the program's ID; fields the library owns.
        unsafe {
            if a.send_cq.is_null() {
                a.send_cq = if !(*me).send_cq.is_null() {
                    (*me).send_cq
                } else {
                    cq_for(
                        a.cap.max_send_wr,
                        &mut (*me).send_cq_channel,
                        &mut (*me).send_cq,
                    )?
                };
            }
            if a.recv_cq.is_null() {
                a.recv_cq = if !(*me).recv_cq.is_null() {
                    (*me).recv_cq
                } else {
                    cq_for(
                        a.cap.max_recv_wr,
                        &mut (*me).recv_cq_channel,
                        &mut (*me).recv_cq,
                    )?
                };
            }
        }
        a.qp_type = x.id.qp_type;
        let qp = crate::qp::ibv_create_qp(pd, a);
        if qp.is_null() {
            return Err(Fail::new(
                // SAFETY: glibc's errno, set by the verb.
                unsafe { *libc::__errno_location() },
                "ibv_create_qp failed",
            ));
        }
        // SAFETY: zeroes are a valid ibv_qp_attr.
        let mut at: ibv_qp_attr = unsafe { core::mem::zeroed() };
        at.qp_state = ibv_qp_state::IBV_QPS_INIT;
        at.port_num = 1;
        at.pkey_index = 0;
        let moved = if x.st().udp {
            at.qkey = UDP_QKEY;
            modify(
                qp,
                &mut at,
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
            )
            .and_then(|()| {
                at.qp_state = ibv_qp_state::IBV_QPS_RTR;
                modify(qp, &mut at, IBV_QP_STATE)
            })
            .and_then(|()| {
                at.qp_state = ibv_qp_state::IBV_QPS_RTS;
                at.sq_psn = 0;
                modify(qp, &mut at, IBV_QP_STATE | IBV_QP_SQ_PSN)
            })
        } else {
            at.qp_access_flags = 0;
            modify(
                qp,
                &mut at,
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
            )
        };
        if let Err(e) = moved {
            crate::qp::ibv_destroy_qp(qp);
            return Err(e);
        }
        Ok(qp)
    })();
    match r {
        Ok(qp) => {
            // SAFETY: the program's ID.
            unsafe {
                (*me).qp = qp;
                (*me).pd = pd;
            }
            x.st().made.extend(made);
            Ok(())
        }
        Err(e) => {
            // What was made for this call goes, and the ID names none of it.
            for m in made.into_iter().rev() {
                let at = match m {
                    Made::Cq(q) => {
                        crate::cq::ibv_destroy_cq(q as *mut ibv_cq);
                        q
                    }
                    Made::Channel(ch) => {
                        crate::cq::ibv_destroy_comp_channel(ch as *mut ibv_comp_channel);
                        ch
                    }
                };
                // SAFETY: the program's ID; fields the library owns.
                unsafe {
                    for f in [
                        core::ptr::addr_of_mut!((*me).send_cq).cast::<usize>(),
                        core::ptr::addr_of_mut!((*me).recv_cq).cast::<usize>(),
                        core::ptr::addr_of_mut!((*me).send_cq_channel).cast::<usize>(),
                        core::ptr::addr_of_mut!((*me).recv_cq_channel).cast::<usize>(),
                    ] {
                        if *f == at {
                            *f = 0;
                        }
                    }
                }
            }
            Err(e)
        }
    }
}

/// `rdma_create_qp`: a QP on the ID's device, in INIT (RC) or RTS with rdma_cm's Q_Key (UD);
/// CQs (with completion channels) are made for it when the attributes name none.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_qp(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    a: *mut ibv_qp_init_attr,
) -> c_int {
    minus_one_call("rdma_create_qp", || {
        let x = id(p)?;
        // SAFETY: the caller's attributes (written back: the capacities granted).
        let a = unsafe { a.as_mut() }.ok_or_else(|| Fail::inval("no attributes"))?;
        create_qp(x, pd, a)
    })
}

/// `rdma_create_qp_ex`: as `rdma_create_qp`, for the attributes `ibv_qp_init_attr` has.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_qp_ex(p: *mut rdma_cm_id, a: *mut ibv_qp_init_attr_ex) -> c_int {
    minus_one_call("rdma_create_qp_ex", || {
        let x = id(p)?;
        // SAFETY: the caller's attributes.
        let ax = unsafe { a.as_mut() }.ok_or_else(|| Fail::inval("no attributes"))?;
        let known = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD
            | ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if ax.comp_mask & !known != 0 {
            return Err(Fail::unsupported(&format!(
                "rdma_create_qp_ex with attributes {:#x}",
                ax.comp_mask & !known
            )));
        }
        let mut b = ibv_qp_init_attr {
            qp_context: ax.qp_context,
            send_cq: ax.send_cq,
            recv_cq: ax.recv_cq,
            srq: ax.srq,
            cap: ax.cap,
            qp_type: ax.qp_type,
            sq_sig_all: ax.sq_sig_all,
        };
        let pd = if ax.comp_mask & ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD != 0 {
            ax.pd
        } else {
            core::ptr::null_mut()
        };
        create_qp(x, pd, &mut b)?;
        ax.cap = b.cap;
        Ok(())
    })
}

/// `rdma_destroy_qp`.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_qp(p: *mut rdma_cm_id) {
    if let Ok(x) = id(p) {
        let me = x.raw();
        // SAFETY: the program's ID.
        unsafe {
            if !(*me).qp.is_null() {
                crate::qp::ibv_destroy_qp((*me).qp);
                (*me).qp = core::ptr::null_mut();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Connections.

/// The QP a connect or accept names: the ID's, or the parameters' `qp_num` for a QP the
/// program made itself.
fn qpn_of(x: &Id, cp: Option<&rdma_conn_param>) -> Res<u32> {
    if !x.id.qp.is_null() {
        // SAFETY: the ID's QP, made by this library's verbs.
        return Ok(unsafe { (*x.id.qp).qp_num });
    }
    match cp {
        Some(c) if c.qp_num != 0 => Ok(c.qp_num),
        _ => Err(Fail::inval(
            "the ID has no QP: rdma_create_qp, or name one in the parameters' qp_num",
        )),
    }
}

fn private_of(cp: Option<&rdma_conn_param>) -> Vec<u8> {
    match cp {
        Some(c) if !c.private_data.is_null() && c.private_data_len > 0 => {
            // SAFETY: the caller's private data, of the length it says.
            unsafe {
                core::slice::from_raw_parts(
                    c.private_data.cast::<u8>(),
                    c.private_data_len as usize,
                )
            }
            .to_vec()
        }
        _ => Vec::new(),
    }
}

/// `rdma_connect`: RC, a REQ (ESTABLISHED, REJECTED or UNREACHABLE later); UD, a SIDR_REQ
/// (ESTABLISHED with the peer's QPN and Q_Key).
#[unsafe(no_mangle)]
pub extern "C" fn rdma_connect(p: *mut rdma_cm_id, cp: *mut rdma_conn_param) -> c_int {
    minus_one_call("rdma_connect", || {
        let x = id(p)?;
        // SAFETY: the caller's parameters, or NULL.
        let cp = unsafe { cp.as_ref() };
        let c = x.ctx()?;
        let (udp, peer) = {
            let st = x.st();
            (st.udp, st.peer)
        };
        let peer = peer.ok_or_else(|| Fail::inval("resolve the address and route first"))?;
        let qpn = qpn_of(x, cp)?;
        let n = x.channel()?.number_in(c)?;
        let req = CmRequest::Connect {
            channel: n,
            id: p as u64,
            qpn,
            udp,
            peer: peer.ip().to_string(),
            port: peer.port(),
            private_data: private_of(cp),
            responder_resources: cp.map_or(0, |c| c.responder_resources),
            initiator_depth: cp.map_or(0, |c| c.initiator_depth),
            retry_count: cp.map_or(7, |c| c.retry_count),
            rnr_retry_count: cp.map_or(7, |c| c.rnr_retry_count),
        };
        c.with(|s| s.cm(req, &[]))?;
        x.complete(CmEventKind::Established)
    })
}

/// `rdma_accept` of the request an ID came with: RC, a REP (ESTABLISHED when the RTU comes);
/// UD, a SIDR_REP with the ID's QP.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_accept(p: *mut rdma_cm_id, cp: *mut rdma_conn_param) -> c_int {
    minus_one_call("rdma_accept", || {
        let x = id(p)?;
        // SAFETY: the caller's parameters, or NULL.
        let cp = unsafe { cp.as_ref() };
        let c = x.ctx()?;
        let (udp, conn, local) = {
            let st = x.st();
            (st.udp, st.conn, st.local)
        };
        let conn = conn.ok_or_else(|| {
            Fail::inval("the ID has no connection request: accept the ID a CONNECT_REQUEST gave")
        })?;
        let qpn = qpn_of(x, cp)?;
        let n = x.channel()?.number_in(c)?;
        let req = CmRequest::Accept {
            channel: n,
            id: p as u64,
            conn,
            udp,
            port: local.map_or(0, |l| l.port()),
            qpn,
            private_data: private_of(cp),
            responder_resources: cp.map_or(0, |c| c.responder_resources),
            initiator_depth: cp.map_or(0, |c| c.initiator_depth),
        };
        c.with(|s| s.cm(req, &[]))?;
        if udp {
            Ok(())
        } else {
            x.complete(CmEventKind::Established)
        }
    })
}

/// `rdma_reject` of the request an ID came with.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_reject(p: *mut rdma_cm_id, _private_data: *const c_void, _len: u8) -> c_int {
    minus_one_call("rdma_reject", || {
        let x = id(p)?;
        let c = x.ctx()?;
        let (udp, conn) = {
            let st = x.st();
            (st.udp, st.conn)
        };
        let conn = conn.ok_or_else(|| Fail::inval("the ID has no connection request"))?;
        c.with(|s| s.cm(CmRequest::Reject { conn, udp }, &[]))?;
        Ok(())
    })
}

/// `rdma_disconnect`: a DREQ; the QP goes to ERR; DISCONNECTED when the DREP comes.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_disconnect(p: *mut rdma_cm_id) -> c_int {
    minus_one_call("rdma_disconnect", || {
        let x = id(p)?;
        let c = x.ctx()?;
        let conn = x
            .st()
            .conn
            .ok_or_else(|| Fail::inval("the ID is not connected"))?;
        // A connection the peer ended first is no error (as rdma_cm's, which answers its DREQ).
        c.with(|s| match s.cm(CmRequest::Disconnect { conn }, &[]) {
            Err(verbs::client::ClientError::Refused { code, .. }) if code == "bad_state" => {
                Ok(Reply::Done)
            }
            r => r,
        })?;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Events.

/// An event handed to the program: `ev` is what it holds, its private data beside it.
#[repr(C)]
struct Ev {
    ev: rdma_cm_event,
    private: [u8; PRIVATE_MAX],
}

fn event_type(k: CmEventKind) -> rdma_cm_event_type::Type {
    use rdma_cm_event_type::*;
    match k {
        CmEventKind::AddrResolved => RDMA_CM_EVENT_ADDR_RESOLVED,
        CmEventKind::AddrError => RDMA_CM_EVENT_ADDR_ERROR,
        CmEventKind::RouteResolved => RDMA_CM_EVENT_ROUTE_RESOLVED,
        CmEventKind::ConnectRequest => RDMA_CM_EVENT_CONNECT_REQUEST,
        CmEventKind::ConnectError => RDMA_CM_EVENT_CONNECT_ERROR,
        CmEventKind::Unreachable => RDMA_CM_EVENT_UNREACHABLE,
        CmEventKind::Rejected => RDMA_CM_EVENT_REJECTED,
        CmEventKind::Established => RDMA_CM_EVENT_ESTABLISHED,
        CmEventKind::Disconnected => RDMA_CM_EVENT_DISCONNECTED,
    }
}

/// The next event on `ch` (waiting as its descriptor's mode says), as the program gets it.
fn next_event(ch: &Channel) -> Res<*mut Ev> {
    let mut buf = vec![0u8; verbs::attach::MAX_MESSAGE];
    loop {
        let n = match rustix::net::recv(&ch.mine, &mut buf, rustix::net::RecvFlags::empty()) {
            Ok((n, _)) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                return Err(Fail::new(
                    e.raw_os_error(),
                    format!("reading the event channel: {e}"),
                ));
            }
        };
        let Some(m) = CmEventMsg::decode(&buf[..n]) else {
            continue;
        };
        if !live(m.id as usize) {
            // For an ID destroyed since.
            continue;
        }
        // SAFETY: a live ID.
        let owner = unsafe { &*(m.id as usize as *const Id) };
        match make_event(owner, &m) {
            Ok(e) => return Ok(e),
            Err(f) => eprintln!("ferroce: an event for an ID was dropped: {}", f.msg),
        }
    }
}

/// The program's event for message `m` about ID `x`: a CONNECT_REQUEST makes the new ID.
fn make_event(x: &Id, m: &CmEventMsg) -> Res<*mut Ev> {
    // SAFETY: rdma_cm_event is C data; zeroes are valid.
    let zero: rdma_cm_event = unsafe { core::mem::zeroed() };
    let mut e = Box::new(Ev {
        ev: zero,
        private: [0; PRIVATE_MAX],
    });
    let n = m.private_data.len().min(PRIVATE_MAX);
    e.private[..n].copy_from_slice(&m.private_data[..n]);
    e.ev.event = event_type(m.kind);
    e.ev.status = m.status;
    e.ev.id = x.raw();
    let udp = x.st().udp;
    match m.kind {
        CmEventKind::ConnectRequest => {
            let child = Id::new(
                if x.sync() {
                    core::ptr::null_mut()
                } else {
                    x.id.channel
                },
                x.id.context,
                x.id.ps,
            )?;
            // SAFETY: just made, live.
            let cx = unsafe { &*child };
            let c = x.ctx()?;
            let listen = x.st().local;
            let peer_ip = parse_ip(m.peer.as_deref().unwrap_or("::"))?;
            let local_ip = match &m.local {
                Some(l) => parse_ip(l)?,
                None => listen.map_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED), |l| l.ip()),
            };
            let port = listen.map_or(0, |l| l.port());
            let fam = listen.map_or(peer_ip, |l| l.ip());
            cx.bind(c, SocketAddr::new(same_family(local_ip, fam), port));
            cx.set_peer(SocketAddr::new(same_family(peer_ip, fam), m.peer_port));
            {
                let mut st = cx.st();
                st.conn = Some(m.conn);
                st.udp = udp;
            }
            e.ev.id = cx.raw();
            e.ev.listen_id = x.raw();
        }
        CmEventKind::Established | CmEventKind::Rejected | CmEventKind::Unreachable
            if m.conn != 0 =>
        {
            x.st().conn = Some(m.conn);
        }
        _ => {}
    }
    let private = if n > 0 {
        e.private.as_ptr().cast::<c_void>()
    } else {
        core::ptr::null()
    };
    if udp {
        // SAFETY: a zeroed union, written as the ID's port space says it is read.
        let ud = unsafe { &mut e.ev.param.ud };
        ud.private_data = private;
        ud.private_data_len = n as u8;
        ud.qp_num = m.remote_qpn;
        ud.qkey = m.qkey;
        if m.kind == CmEventKind::Established {
            let peer = x.st().peer;
            if let Some(peer) = peer {
                ud.ah_attr.is_global = 1;
                ud.ah_attr.port_num = 1;
                ud.ah_attr.grh.dgid.raw = gid_of(peer.ip());
                ud.ah_attr.grh.hop_limit = 64;
            }
        }
    } else {
        // SAFETY: as above.
        let cp = unsafe { &mut e.ev.param.conn };
        cp.private_data = private;
        cp.private_data_len = n as u8;
        cp.responder_resources = m.responder_resources;
        cp.initiator_depth = m.initiator_depth;
        cp.retry_count = m.retry_count;
        cp.rnr_retry_count = m.rnr_retry_count;
        cp.qp_num = m.remote_qpn;
    }
    Ok(Box::leak(e) as *mut Ev)
}

/// `rdma_get_cm_event`: the next event on the channel.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_cm_event(
    c: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    // Reading an empty non-blocking channel is no error worth a line.
    let ch = match channel(c) {
        Ok(ch) => ch,
        Err(_) => {
            crate::set_errno(libc::EINVAL);
            return -1;
        }
    };
    if out.is_null() {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    match next_event(ch) {
        Ok(e) => {
            // SAFETY: the caller's pointer.
            unsafe { *out = e as *mut rdma_cm_event };
            0
        }
        Err(f) => {
            if f.errno != libc::EAGAIN {
                eprintln!("ferroce: rdma_get_cm_event: {}", f.msg);
            }
            crate::set_errno(f.errno);
            -1
        }
    }
}

/// `rdma_ack_cm_event`.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_ack_cm_event(e: *mut rdma_cm_event) -> c_int {
    if e.is_null() {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: an event this library made; acknowledged once.
    drop(unsafe { Box::from_raw(e as *mut Ev) });
    0
}

fn event_name(t: rdma_cm_event_type::Type) -> &'static str {
    const NAMES: [&str; 16] = [
        "RDMA_CM_EVENT_ADDR_RESOLVED",
        "RDMA_CM_EVENT_ADDR_ERROR",
        "RDMA_CM_EVENT_ROUTE_RESOLVED",
        "RDMA_CM_EVENT_ROUTE_ERROR",
        "RDMA_CM_EVENT_CONNECT_REQUEST",
        "RDMA_CM_EVENT_CONNECT_RESPONSE",
        "RDMA_CM_EVENT_CONNECT_ERROR",
        "RDMA_CM_EVENT_UNREACHABLE",
        "RDMA_CM_EVENT_REJECTED",
        "RDMA_CM_EVENT_ESTABLISHED",
        "RDMA_CM_EVENT_DISCONNECTED",
        "RDMA_CM_EVENT_DEVICE_REMOVAL",
        "RDMA_CM_EVENT_MULTICAST_JOIN",
        "RDMA_CM_EVENT_MULTICAST_ERROR",
        "RDMA_CM_EVENT_ADDR_CHANGE",
        "RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ];
    NAMES.get(t as usize).copied().unwrap_or("UNKNOWN EVENT")
}

/// `rdma_event_str`.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_event_str(t: rdma_cm_event_type::Type) -> *const c_char {
    const Z: [&core::ffi::CStr; 17] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        c"UNKNOWN EVENT",
    ];
    Z[(t as usize).min(16)].as_ptr()
}

// ---------------------------------------------------------------------------------------------
// Options, addresses, endpoints.

/// `rdma_set_option`: the ID options a RoCE connection has no use for here are taken
/// (REUSEADDR, AFONLY); TOS and the ACK timeout are not carried yet and say so.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_set_option(
    p: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    _val: *mut c_void,
    _len: usize,
) -> c_int {
    minus_one_call("rdma_set_option", || {
        id(p)?;
        const LEVEL_ID: c_int = 0;
        const REUSEADDR: c_int = 1;
        const AFONLY: c_int = 2;
        const TOS: c_int = 0;
        const ACK_TIMEOUT: c_int = 3;
        match (level, name) {
            (LEVEL_ID, REUSEADDR | AFONLY) => Ok(()),
            (LEVEL_ID, TOS | ACK_TIMEOUT) => {
                eprintln!(
                    "ferroce: rdma_set_option: the ID's {} is not carried by ferroce's CM yet; \
                     the default is used",
                    if name == TOS { "TOS" } else { "ACK timeout" }
                );
                Ok(())
            }
            _ => Err(Fail::new(
                libc::ENOSYS,
                format!("option {name} of level {level} is not offered by ferroce"),
            )),
        }
    })
}

/// `rdma_get_src_port` (network order).
#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_src_port(p: *mut rdma_cm_id) -> u16 {
    id(p)
        .ok()
        .and_then(|x| x.st().local)
        .map_or(0, |a| a.port().to_be())
}

/// `rdma_get_dst_port` (network order).
#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_dst_port(p: *mut rdma_cm_id) -> u16 {
    id(p)
        .ok()
        .and_then(|x| x.st().peer)
        .map_or(0, |a| a.port().to_be())
}

/// `rdma_getaddrinfo`: the addresses `node`:`service` name, as librdmacm gives them (in the
/// source address with `RAI_PASSIVE`, else the destination), each with its port space and
/// QP type from the hints (TCP and RC by default).
#[unsafe(no_mangle)]
pub extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    minus_one_call("rdma_getaddrinfo", || {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return Err(Fail::inval("rdma_getaddrinfo needs a node or a service"));
        }
        // SAFETY: the caller's hints, or NULL.
        let h = unsafe { hints.as_ref() };
        let passive = h.is_some_and(|h| h.ai_flags as u32 & RAI_PASSIVE != 0);
        let ps = h
            .map(|h| h.ai_port_space)
            .filter(|&p| p != 0)
            .unwrap_or(rdma_port_space::RDMA_PS_TCP as c_int);
        let qpt = h.map(|h| h.ai_qp_type).filter(|&q| q != 0).unwrap_or(
            if ps == rdma_port_space::RDMA_PS_UDP as c_int {
                ibv_qp_type::IBV_QPT_UD as c_int
            } else {
                ibv_qp_type::IBV_QPT_RC as c_int
            },
        );
        // SAFETY: zeroes are a valid addrinfo of hints.
        let mut ah: libc::addrinfo = unsafe { core::mem::zeroed() };
        ah.ai_family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
        ah.ai_socktype = libc::SOCK_STREAM;
        if passive {
            ah.ai_flags |= libc::AI_PASSIVE;
        }
        if h.is_some_and(|h| h.ai_flags as u32 & RAI_NUMERICHOST != 0) {
            ah.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut list: *mut libc::addrinfo = core::ptr::null_mut();
        // SAFETY: C strings of the caller's, or NULL; glibc's resolver.
        let r = unsafe { libc::getaddrinfo(node, service, &ah, &mut list) };
        if r != 0 {
            return Err(Fail::new(
                libc::EADDRNOTAVAIL,
                format!("getaddrinfo failed (EAI {r})"),
            ));
        }
        let mut addrs = Vec::new();
        let mut at = list;
        while !at.is_null() {
            // SAFETY: glibc's list.
            let a = unsafe { &*at };
            if let Ok(s) = sockaddr_in(a.ai_addr.cast()) {
                addrs.push(s);
            }
            at = a.ai_next;
        }
        // SAFETY: glibc's list, freed once.
        unsafe { libc::freeaddrinfo(list) };
        if addrs.is_empty() {
            return Err(Fail::new(libc::EADDRNOTAVAIL, "no IPv4 or IPv6 address"));
        }
        let mut head: *mut rdma_addrinfo = core::ptr::null_mut();
        for a in addrs.into_iter().rev() {
            // SAFETY: zeroes are a valid rdma_addrinfo.
            let mut ai: Box<rdma_addrinfo> = Box::new(unsafe { core::mem::zeroed() });
            ai.ai_flags = h.map_or(0, |h| h.ai_flags);
            ai.ai_family = match a {
                SocketAddr::V4(_) => libc::AF_INET,
                SocketAddr::V6(_) => libc::AF_INET6,
            };
            ai.ai_qp_type = qpt;
            ai.ai_port_space = ps;
            let sa = Box::leak(Box::new(
                // SAFETY: zeroes are a valid sockaddr_storage.
                unsafe { core::mem::zeroed::<libc::sockaddr_storage>() },
            )) as *mut libc::sockaddr_storage;
            put_sockaddr(sa.cast(), a);
            if passive {
                ai.ai_src_addr = sa.cast();
                ai.ai_src_len = sockaddr_len(a) as socklen_t;
            } else {
                ai.ai_dst_addr = sa.cast();
                ai.ai_dst_len = sockaddr_len(a) as socklen_t;
            }
            ai.ai_next = head;
            head = Box::leak(ai);
        }
        // SAFETY: the caller's pointer.
        unsafe { *res = head };
        Ok(())
    })
}

/// `rdma_freeaddrinfo`.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut at = res;
    while !at.is_null() {
        // SAFETY: a list rdma_getaddrinfo made: each node and address boxed.
        let ai = unsafe { Box::from_raw(at) };
        for sa in [ai.ai_src_addr, ai.ai_dst_addr] {
            if !sa.is_null() {
                // SAFETY: boxed sockaddr_storage of rdma_getaddrinfo's.
                drop(unsafe { Box::from_raw(sa.cast::<libc::sockaddr_storage>()) });
            }
        }
        at = ai.ai_next;
    }
}

/// `rdma_create_ep`: a synchronous ID for an address of `rdma_getaddrinfo`'s: passive, bound
/// (its QP attributes kept for `rdma_get_request`); active, resolved, with its QP if the
/// attributes are given.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init: *mut ibv_qp_init_attr,
) -> c_int {
    minus_one_call("rdma_create_ep", || {
        // SAFETY: the caller's addrinfo.
        let ai = unsafe { res.as_ref() }.ok_or_else(|| Fail::inval("no address"))?;
        if out.is_null() {
            return Err(Fail::inval("no place for the ID"));
        }
        let p = Id::new(
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            ai.ai_port_space as u32,
        )?;
        let raw = p as *mut rdma_cm_id;
        let undo = |f: Fail| {
            rdma_destroy_id(raw);
            f
        };
        // SAFETY: just made, live.
        let x = unsafe { &*p };
        let ok = if ai.ai_flags as u32 & RAI_PASSIVE != 0 {
            match rdma_bind_addr(raw, ai.ai_src_addr) {
                0 => {
                    // SAFETY: the caller's attributes, or NULL.
                    if let Some(q) = unsafe { qp_init.as_ref() } {
                        x.st().ep_qp = Some((*q, pd as usize));
                    }
                    Ok(())
                }
                _ => Err(Fail::new(libc::EADDRNOTAVAIL, "binding the endpoint")),
            }
        } else if rdma_resolve_addr(raw, ai.ai_src_addr, ai.ai_dst_addr, 2000) != 0 {
            Err(Fail::new(
                libc::EHOSTUNREACH,
                "resolving the endpoint's address",
            ))
        } else if rdma_resolve_route(raw, 2000) != 0 {
            Err(Fail::new(
                libc::EHOSTUNREACH,
                "resolving the endpoint's route",
            ))
        } else {
            // SAFETY: the caller's attributes, or NULL.
            match unsafe { qp_init.as_mut() } {
                Some(q) => create_qp(x, pd, q),
                None => Ok(()),
            }
        };
        ok.map_err(undo)?;
        // SAFETY: the caller's pointer.
        unsafe { *out = raw };
        Ok(())
    })
}

/// `rdma_destroy_ep`.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_ep(p: *mut rdma_cm_id) {
    rdma_destroy_qp(p);
    rdma_destroy_id(p);
}

/// `rdma_get_request`: the next connection request on a synchronous listening ID, as a new
/// ID with a QP if the endpoint's attributes say.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, out: *mut *mut rdma_cm_id) -> c_int {
    minus_one_call("rdma_get_request", || {
        let x = id(listen)?;
        let own = x.own.as_ref().ok_or_else(|| {
            Fail::inval("rdma_get_request takes a synchronous ID (made without a channel)")
        })?;
        if out.is_null() {
            return Err(Fail::inval("no place for the ID"));
        }
        let e = next_event(own)?;
        // SAFETY: the event just made.
        let (kind, child) = unsafe { ((*e).ev.event, (*e).ev.id) };
        if kind != rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
            x.keep_event(e);
            return Err(Fail::new(
                libc::EIO,
                format!("{} instead of a connection request", event_name(kind)),
            ));
        }
        let c = id(child)?;
        let ep = x.st().ep_qp;
        if let Some((mut q, pd)) = ep
            && let Err(f) = create_qp(c, pd as *mut ibv_pd, &mut q)
        {
            let _ = rdma_reject(child, core::ptr::null(), 0);
            rdma_ack_cm_event(e as *mut rdma_cm_event);
            rdma_destroy_id(child);
            return Err(f);
        }
        c.keep_event(e);
        // SAFETY: the caller's pointer.
        unsafe { *out = child };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// What is not offered: defined here so the real librdmacm is never reached with our IDs.

macro_rules! not_offered {
    ($($name:ident ( $($arg:ident : $t:ty),* ) -> $ret:ty = $fail:expr;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: not offered by ferroce.")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $name($($arg: $t),*) -> $ret {
            $(let _ = $arg;)*
            eprintln!("ferroce: {} is not offered by ferroce yet", stringify!($name));
            crate::set_errno(libc::EOPNOTSUPP);
            $fail
        }
    )*};
}

not_offered! {
    rdma_migrate_id(i: *mut rdma_cm_id, c: *mut rdma_event_channel) -> c_int = -1;
    rdma_init_qp_attr(i: *mut rdma_cm_id, a: *mut ibv_qp_attr, m: *mut c_int) -> c_int = -1;
    rdma_establish(i: *mut rdma_cm_id) -> c_int = -1;
    rdma_notify(i: *mut rdma_cm_id, e: c_int) -> c_int = -1;
    rdma_join_multicast(i: *mut rdma_cm_id, a: *mut sockaddr, c: *mut c_void) -> c_int = -1;
    rdma_join_multicast_ex(i: *mut rdma_cm_id, a: *mut c_void, c: *mut c_void) -> c_int = -1;
    rdma_leave_multicast(i: *mut rdma_cm_id, a: *mut sockaddr) -> c_int = -1;
    rdma_create_srq(i: *mut rdma_cm_id, p: *mut ibv_pd, a: *mut c_void) -> c_int = -1;
    rdma_create_srq_ex(i: *mut rdma_cm_id, a: *mut c_void) -> c_int = -1;
    rdma_get_remote_ece(i: *mut rdma_cm_id, e: *mut c_void) -> c_int = -1;
    rdma_set_local_ece(i: *mut rdma_cm_id, e: *mut c_void) -> c_int = -1;
    rdma_reject_ece(i: *mut rdma_cm_id, d: *const c_void, l: u8) -> c_int = -1;
}

/// `rdma_destroy_srq`: there are none to destroy.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_srq(_i: *mut rdma_cm_id) {}

/// `rdma_get_devices`: the contexts the CM uses, NULL-terminated (malloc'd).
#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    ptr_call("rdma_get_devices", || {
        let all = contexts()?;
        // SAFETY: a malloc'd array of all.len() + 1 pointers, freed by rdma_free_devices.
        let arr = unsafe { libc::calloc(all.len() + 1, size_of::<*mut ibv_context>()) }
            as *mut *mut ibv_context;
        if arr.is_null() {
            return Err(Fail::new(libc::ENOMEM, "no memory"));
        }
        for (i, c) in all.iter().enumerate() {
            // SAFETY: within the array.
            unsafe { *arr.add(i) = c.ibv() };
        }
        if !num.is_null() {
            // SAFETY: the caller's pointer.
            unsafe { *num = all.len() as c_int };
        }
        Ok(arr)
    })
}

/// `rdma_free_devices`.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the array rdma_get_devices malloc'd (contexts stay open).
    unsafe { libc::free(list.cast()) };
}
