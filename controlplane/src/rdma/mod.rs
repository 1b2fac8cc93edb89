//! The node's RDMA objects as the control plane keeps them: memory regions registered
//! node-wide (one hugepage buffer, the same key on every lcore), QPs placed on lcores, GIDs
//! resolved to paths. The REST API (and applications in the process) call this; it talks to
//! the lcores over their command channels and waits for their replies, never on an lcore.
//!
//! Each operation is applied whole or not at all: a region that one lcore refuses is taken
//! back from the others, a QP whose connect fails stays where it was.

use crossbeam_channel::{Sender, bounded};
use dataplane::appliance::ApplianceCommand;
use dataplane::cc::{CcKind, DcqcnParams};
use dataplane::host::{HostCounters, RdmaCommand, Shard, shard_of};
use dataplane::lcore::Command;
use dataplane::mem::SharedMem;
use dataplane::net::NetStack;
use dataplane::port::MacAddr;
use dataplane::transport::cq::{LatencyHistograms, WcOpcode, WcStatus, WorkCompletion};
use dataplane::transport::device::{CqState, DeviceError, QpQuery};
use dataplane::transport::mr::{Access, MrError, MrTable, PdHandle};
use dataplane::transport::perftest::{LatKind, LatResult, Reply, Shape, StreamResult};
use dataplane::transport::qp::ModifyError;
use dataplane::transport::qp::{Mtu, Path, QpAttr, QpState, QpType};
use dataplane::transport::rc::QpCaps;
use dataplane::transport::wr::{RecvWr, SendWr, UdDest};
use dataplane::wire::Psn;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

mod apps;
mod cm;
mod objects;
mod qp;
mod work;

pub use cm::{CmConnInfo, CmListenerInfo, CmOpts, CmRole, CmSpace, CmWatch, MAX_BACKLOG, MAX_WAIT};

/// How long the control plane waits for an lcore's answer.
const LCORE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connect waits for the remote GID's MAC.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);
/// QPs a node holds at most (a device's max_qp): two lcores' worth, each lcore holding up to
/// 2^20 (the QPN bits below its shard, `QPN_SHARD_SHIFT`) less the two special QPs on the first.
pub const MAX_QPS: usize = 1 << 21;
/// QPs one lcore command creates at most (a bulk create sends several).
const BULK_CHUNK: usize = 1024;
/// Largest region one registration may ask for.
pub const MAX_MR_BYTES: usize = 1 << 30;

/// What kind of refusal an [`RdmaError`] is (the REST API answers each with its own status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The request itself is wrong.
    Invalid,
    /// No such object.
    NotFound,
    /// The object's state does not allow it.
    Conflict,
    /// An lcore did not answer.
    Unavailable,
    /// A test did not finish in the time its caller gave it (it was stopped).
    TimedOut,
    /// What the caller waited for from elsewhere (a peer's answer, a connection request) did
    /// not come in the time it gave: nothing is wrong with the node or the request.
    Expired,
    /// The node could not do it.
    Internal,
}

/// Why an operation on the node's RDMA objects was refused: its kind, a stable machine-readable
/// code and a message for people. HTTP is the API's business (`api::RdmaError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RdmaError {
    /// What kind of refusal.
    pub kind: Refusal,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// What went wrong, for people.
    pub message: String,
}

impl RdmaError {
    /// The request itself is wrong.
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        RdmaError {
            kind: Refusal::Invalid,
            code,
            message: message.into(),
        }
    }
    /// No such object.
    pub fn not_found(what: impl Into<String>) -> Self {
        RdmaError {
            kind: Refusal::NotFound,
            code: "not_found",
            message: what.into(),
        }
    }
    /// The object's state does not allow it.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        RdmaError {
            kind: Refusal::Conflict,
            code,
            message: message.into(),
        }
    }
    /// The node could not do it (an lcore that does not answer: `lcore_unavailable`).
    pub fn internal(code: &'static str, message: impl Into<String>) -> Self {
        RdmaError {
            kind: if code == "lcore_unavailable" {
                Refusal::Unavailable
            } else {
                Refusal::Internal
            },
            code,
            message: message.into(),
        }
    }
}

fn mr_error(e: MrError) -> RdmaError {
    match e {
        MrError::InvalidKey => RdmaError::not_found("no memory region with that key"),
        MrError::OutOfBounds => RdmaError::bad("out_of_bounds", "the range is outside the region"),
        MrError::BadAccessFlags => RdmaError::bad(
            "bad_access",
            "remote-write and remote-atomic access need local-write",
        ),
        MrError::TooMany => RdmaError::conflict("too_many", "too many memory regions"),
        other => RdmaError::bad("mr", other.to_string()),
    }
}

/// A shard's refusal as the node gives it: by what was refused, in one place (the API turns
/// the kind into an HTTP status).
impl From<DeviceError> for RdmaError {
    fn from(e: DeviceError) -> Self {
        let msg = e.to_string();
        match e {
            DeviceError::NoQp(_) | DeviceError::NoCq(_) | DeviceError::NoPd(_) => {
                RdmaError::not_found(msg)
            }
            DeviceError::PdInUse(_) => RdmaError::conflict("pd_busy", msg),
            DeviceError::CqInUse { .. } => {
                RdmaError::conflict("cq_busy", format!("{msg}: destroy those QPs first"))
            }
            DeviceError::NoCqNumbers | DeviceError::NoQpNumbers => {
                RdmaError::conflict("too_many", msg)
            }
            DeviceError::Mr(m) => mr_error(m),
            DeviceError::Caps(_) => RdmaError::bad("bad_caps", msg),
            // An attribute out of range, missing or not for this transition is the request's
            // fault (400); a transition the QP's state does not allow is the state's (409).
            DeviceError::Modify(
                ModifyError::Invalid(_) | ModifyError::Missing(_) | ModifyError::NotAllowed(_),
            ) => RdmaError::bad("bad_attr", msg),
            DeviceError::Modify(_) => RdmaError::conflict("bad_state", msg),
            DeviceError::Post(_) => RdmaError::conflict("post_refused", msg),
            DeviceError::Member { qpn, source } => {
                let r = RdmaError::from(*source);
                RdmaError {
                    message: format!("QP {qpn}: {}", r.message),
                    ..r
                }
            }
        }
    }
}

/// A registered region as the node lists it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MrInfo {
    /// Local key.
    pub lkey: u32,
    /// Remote key (the same).
    pub rkey: u32,
    /// Virtual address the region answers to.
    pub addr: u64,
    /// Bytes.
    pub length: usize,
    /// Rights, as names.
    pub access: Vec<&'static str>,
    /// Backed by DPDK hugepages.
    pub hugepage: bool,
    /// Frames carry its bytes attached from the memory, not copied (hugepage memory with an IO
    /// address, or an application's memory registered with DPDK), for payloads of at least
    /// 2 KiB on ports with multi-segment transmit.
    pub zero_copy: bool,
    /// Protection domain.
    pub pdn: u32,
}

/// Access flag names, in the spelling of `rdma` and `ibv_access_flags`.
pub const ACCESS_NAMES: [(&str, Access); 4] = [
    ("local-write", Access::LOCAL_WRITE),
    ("remote-write", Access::REMOTE_WRITE),
    ("remote-read", Access::REMOTE_READ),
    ("remote-atomic", Access::REMOTE_ATOMIC),
];

/// Parses access names into flags; the error names the bad one.
pub fn parse_access(names: &[String]) -> Result<Access, RdmaError> {
    let mut a = Access::NONE;
    for n in names {
        let Some((_, f)) = ACCESS_NAMES.iter().find(|(k, _)| k == n) else {
            return Err(RdmaError::bad(
                "bad_access",
                format!(
                    "unknown access {n:?}: use {}",
                    ACCESS_NAMES.map(|(k, _)| k).join(", ")
                ),
            ));
        };
        a = a | *f;
    }
    Ok(a)
}

/// Names of the flags set in `a`.
pub fn access_names(a: Access) -> Vec<&'static str> {
    ACCESS_NAMES
        .iter()
        .filter(|(_, f)| a.contains(*f))
        .map(|(k, _)| *k)
        .collect()
}

struct MrEntry {
    info: MrInfo,
}

struct Mrs {
    table: MrTable,
    /// The default protection domain (0): regions and QPs created without one go there.
    pd: PdHandle,
    /// Live protection domains.
    pds: std::collections::BTreeSet<u32>,
    meta: BTreeMap<u32, MrEntry>,
}

/// A protection domain as the node lists it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PdInfo {
    /// Its number.
    pub pdn: u32,
    /// Memory regions in it.
    pub mrs: usize,
    /// QPs in it.
    pub qps: usize,
}

/// A completion queue as the node lists it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CqInfo {
    /// Its number (bits 20-23: the lcore it lives on, as in QPNs).
    pub cqn: u32,
    /// The lcore it lives on; QPs that use it are placed there.
    pub lcore: usize,
    /// Capacity (completions).
    pub cqe: usize,
    /// Completions waiting.
    pub waiting: usize,
    /// QP send and receive queues whose completions go to it.
    pub users: u32,
    /// It overflowed: completions were lost and it accepts no more (destroy it and its QPs).
    pub in_error: bool,
}

/// Largest CQ one request may create (its entries are allocated when it is created, so the
/// packet path never allocates).
pub const MAX_CQE: usize = 1 << 16;
/// Completions all of a node's created CQs may hold together (about 40 bytes each).
pub const MAX_CQE_TOTAL: usize = 1 << 22;
/// Protection domains a node holds at most.
pub const MAX_PDS: usize = 1 << 16;

/// Refuses QPNs and PSNs past 24 bits.
fn check_24bit(a: &QpAttr) -> Result<(), RdmaError> {
    let big = |p: Option<u32>| p.is_some_and(|p| p > 0xff_ffff);
    if big(a.dest_qp) || big(a.rq_psn) || big(a.sq_psn) {
        return Err(RdmaError::bad(
            "bad_attr",
            "QPNs and PSNs are 24-bit (at most 16777215)",
        ));
    }
    Ok(())
}

/// The peer's first PSN (our rq_psn), which an RC QP cannot be connected without (PSNs start
/// at random).
fn remote_psn(a: &QpAttr) -> Result<u32, RdmaError> {
    a.rq_psn.ok_or_else(|| {
        RdmaError::bad(
            "missing",
            "remote_psn is required: the PSN the peer QP starts sending with (its sq-psn, in \
             GET /v1/qps/N on its node); QPs start at a random PSN",
        )
    })
}

/// Where a new QP goes: its protection domain and the created CQs its send and receive
/// completions go to (None: the defaults).
#[derive(Clone, Copy, Debug, Default)]
pub struct QpPlacement {
    /// Protection domain.
    pub pd: Option<u32>,
    /// Send and receive CQs.
    pub cqs: [Option<u32>; 2],
}

/// Where a GID is reached: port, our address there, the next hop's MAC, the port's VLAN.
type Resolved = (usize, IpAddr, MacAddr, Option<(u16, u8)>);

#[derive(Clone, Debug)]
struct QpMeta {
    lcore: usize,
    pd: u32,
    /// Created CQs its send and receive completions go to.
    cqs: [Option<u32>; 2],
    /// The PSN it starts sending with unless a connect or modify to RTS names another: drawn
    /// at random when it is created (as perftest and rdma-core's examples draw theirs), so
    /// that an off-path sender cannot guess where its sequence stands.
    psn: u32,
    /// What it takes of the node's QP memory (`dataplane::transport::device::qp_footprint`).
    bytes: usize,
}

/// QP `qpn`'s entry in the QP table, or 404.
fn meta(t: &BTreeMap<u32, QpMeta>, qpn: u32) -> Result<&QpMeta, RdmaError> {
    t.get(&qpn)
        .ok_or_else(|| RdmaError::not_found(format!("no QP {qpn}")))
}

/// 64 bits from the OS's random source (std's SipHash keys are drawn from it per hasher).
fn os_random() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
}

/// A random starting PSN (24 bits).
fn random_psn() -> u32 {
    (os_random() & 0xff_ffff) as u32
}

/// The node's RDMA objects.
pub struct Rdma {
    lcores: Vec<Sender<Command<ApplianceCommand>>>,
    alloc: Box<dyn Fn(usize) -> Result<SharedMem, String> + Send + Sync>,
    mrs: Mutex<Mrs>,
    qps: Mutex<BTreeMap<u32, QpMeta>>,
    /// Created CQs: lcore and capacity.
    cqs: Mutex<BTreeMap<u32, (usize, usize)>>,
    neigh: Mutex<HashMap<(usize, IpAddr), MacAddr>>,
    resolved: Condvar,
    routes: Mutex<NetStack<Vec<u8>>>,
    macs: Vec<MacAddr>,
    /// Per port: its MTU (the IP packets it carries), which bounds a QP's path MTU.
    mtus: Vec<u16>,
    /// Applications' address handles: which numbers are taken (number = index + 1).
    app_ahs: Mutex<Vec<bool>>,
    /// Per port: its GID table (as rxe builds one: the link-local GID from the MAC, then
    /// each IPv4 address IPv4-mapped, then each IPv6 address).
    gids: Vec<Vec<std::net::Ipv6Addr>>,
    line_bps: f64,
    /// Bytes the node's QPs may take at most (see [`qp_memory_budget`]).
    qp_budget: usize,
    /// Bytes its QPs take now: changed only under the QP table's lock.
    qp_bytes: AtomicUsize,
    /// RDMA CM: listeners, connections, the events of shard 0's CM.
    cm: std::sync::Arc<cm::CmShared>,
}

/// The memory a node's QPs may take together, by the footprint each QP's caps give it (its
/// queues at full depth, inline slots and CQs, as a device sizes QP contexts): three
/// quarters of the machine's memory. Creating a QP past it fails at once with 409
/// `out_of_resources` (an RNIC's ENOMEM), where it would otherwise page the machine to a
/// standstill or end the process on a failed allocation.
pub fn qp_memory_budget() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            .map(|kib| kib << 10)
    });
    total.unwrap_or(16 << 30) / 4 * 3
}

impl core::fmt::Debug for Rdma {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Rdma")
            .field("lcores", &self.lcores.len())
            .finish()
    }
}

/// Parses a GID: IPv4, IPv6, or IPv4-mapped IPv6 (which means the IPv4 address).
pub fn parse_gid(s: &str) -> Result<IpAddr, RdmaError> {
    s.parse::<IpAddr>()
        .map(|a| a.to_canonical())
        .map_err(|_| RdmaError::bad("bad_gid", format!("{s:?} is not an IPv4 or IPv6 GID")))
}

/// The UDP source port of a QP's packets towards `remote_qpn` at `remote_ip`: Linux's choice
/// for the QPN pair (`source_port_for_qp`), moved to the nearest port with which a receiver
/// whose ports run ferroce's RSS set-up delivers the packets on the queue of the lcore owning
/// the remote QP (its QPN names it; see `dataplane::port::rss`), so they need no handoff there.
pub fn udp_sport(lqpn: u32, local_ip: IpAddr, remote_ip: IpAddr, remote_qpn: u32) -> u16 {
    let base = dataplane::wire::udp::source_port_for_qp(lqpn, remote_qpn);
    dataplane::port::rss::steer_sport(local_ip, remote_ip, base, shard_of(remote_qpn) as u16)
}

impl Rdma {
    /// The service for these lcores. `alloc` gives zeroed region memory (hugepages on a
    /// node); `net` is the node's IP configuration (for routes and source addresses), `macs`
    /// its ports' MACs, `line_bps` the rate DCQCN starts QPs at.
    pub fn new(
        lcores: Vec<Sender<Command<ApplianceCommand>>>,
        alloc: Box<dyn Fn(usize) -> Result<SharedMem, String> + Send + Sync>,
        net: &dataplane::net::NetConfig,
        macs: Vec<MacAddr>,
        line_bps: f64,
    ) -> Self {
        // Keys with a random 8-bit variant per slot, as RNICs give them.
        let mut table = MrTable::with_key_seed(os_random() | 1);
        let pd = table.alloc_pd();
        Rdma {
            cm: std::sync::Arc::new(cm::CmShared::new(lcores.clone())),
            lcores,
            alloc,
            mrs: Mutex::new(Mrs {
                table,
                pd,
                pds: [pd.0].into(),
                meta: BTreeMap::new(),
            }),
            qps: Mutex::new(BTreeMap::new()),
            cqs: Mutex::new(BTreeMap::new()),
            neigh: Mutex::new(HashMap::new()),
            resolved: Condvar::new(),
            routes: Mutex::new(NetStack::new(net, &macs, None)),
            gids: net
                .ports
                .iter()
                .zip(&macs)
                .map(|(p, mac)| {
                    let m = mac.0;
                    let mut t = vec![std::net::Ipv6Addr::from([
                        0xfe,
                        0x80,
                        0,
                        0,
                        0,
                        0,
                        0,
                        0,
                        m[0] ^ 2,
                        m[1],
                        m[2],
                        0xff,
                        0xfe,
                        m[3],
                        m[4],
                        m[5],
                    ])];
                    t.extend(
                        p.ipv4.iter().map(|c| {
                            std::net::Ipv4Addr::from(c.address().octets()).to_ipv6_mapped()
                        }),
                    );
                    t.extend(
                        p.ipv6
                            .iter()
                            .map(|c| std::net::Ipv6Addr::from(c.address().octets())),
                    );
                    t
                })
                .collect(),
            macs,
            mtus: Vec::new(),
            app_ahs: Mutex::new(Vec::new()),
            line_bps,
            qp_budget: qp_memory_budget(),
            qp_bytes: AtomicUsize::new(0),
        }
    }

    /// The node's QP memory: bytes its QPs take and the most they may.
    pub fn qp_memory(&self) -> (usize, usize) {
        (self.qp_bytes.load(Ordering::Relaxed), self.qp_budget)
    }

    /// What `count` QPs with `caps` would take of the QP memory, if it fits (the caller holds
    /// the QP table's lock and adds it once they exist), else 409 `out_of_resources`.
    fn qp_room(&self, count: usize, caps: &QpCaps) -> Result<usize, RdmaError> {
        let each = dataplane::transport::device::qp_footprint(caps);
        let want = each.saturating_mul(count);
        let held = self.qp_bytes.load(Ordering::Relaxed);
        if want > self.qp_budget.saturating_sub(held) {
            let mib = |b: usize| b >> 20;
            return Err(RdmaError::conflict(
                "out_of_resources",
                format!(
                    "{count} QP(s) with these caps take {} MiB ({each} B each: queues at full \
                     depth, inline slots and CQs), and the node's QP memory has {} MiB of {} MiB \
                     left: fewer QPs, shallower queues or less inline data fit",
                    mib(want),
                    mib(self.qp_budget.saturating_sub(held)),
                    mib(self.qp_budget)
                ),
            ));
        }
        Ok(want)
    }

    /// Port `port`'s MTU (1500 unless the node said otherwise).
    pub fn port_mtu(&self, port: usize) -> u16 {
        self.mtus.get(port).copied().unwrap_or(1500)
    }

    /// Port `port`'s MAC address.
    pub fn mac(&self, port: usize) -> Option<MacAddr> {
        self.macs.get(port).copied()
    }

    /// Port `port`'s GID table (empty for a port without one).
    pub fn gids(&self, port: usize) -> Vec<std::net::Ipv6Addr> {
        self.gids.get(port).cloned().unwrap_or_default()
    }

    /// Number of worker lcores.
    pub fn lcores(&self) -> usize {
        self.lcores.len()
    }

    /// Records a neighbour an lcore resolved.
    pub fn neighbor_resolved(&self, port: usize, ip: IpAddr, mac: MacAddr) {
        self.neigh
            .lock()
            .expect("neighbour table")
            .insert((port, ip), mac);
        self.resolved.notify_all();
    }

    /// Runs `f` (one verb) on `lcore`'s shard and waits for its answer.
    fn ask<T: Send + 'static>(
        &self,
        lcore: usize,
        f: impl FnOnce(&mut Shard, dataplane::Instant) -> T + Send + 'static,
    ) -> Result<T, RdmaError> {
        let (tx, rx) = bounded(1);
        self.lcores[lcore]
            .send(Command::Handler(ApplianceCommand::Rdma(RdmaCommand::call(
                tx, f,
            ))))
            .map_err(|_| RdmaError::internal("lcore_unavailable", "the lcore has stopped"))?;
        rx.recv_timeout(LCORE_TIMEOUT).map_err(|_| {
            RdmaError::internal(
                "lcore_unavailable",
                format!("lcore {lcore} did not answer in {LCORE_TIMEOUT:?}"),
            )
        })
    }
}

/// An lcore's RDMA counters as JSON: the QP counters under their rxe/mlx5 names, summed, and
/// the handoffs.
pub fn host_counters_json(h: &HostCounters) -> serde_json::Map<String, serde_json::Value> {
    let mut m: serde_json::Map<String, serde_json::Value> = h
        .dev
        .qp
        .named()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into()))
        .collect();
    m.insert("handoffs".into(), h.handoffs.into());
    m.insert("handoff_drops".into(), h.handoff_drops.into());
    for (k, v) in h.cm.named() {
        m.insert(format!("cm_{k}"), v.into());
    }
    for (k, v) in h.gsi.named() {
        m.insert(format!("gsi_{k}"), v.into());
    }
    m
}

/// Names of completion statuses, as `ibv_wc_status_str` spells them.
pub fn wc_status_name(s: WcStatus) -> &'static str {
    match s {
        WcStatus::Success => "success",
        WcStatus::LocLenErr => "local length error",
        WcStatus::LocQpOpErr => "local QP operation error",
        WcStatus::LocProtErr => "local protection error",
        WcStatus::WrFlushErr => "Work Request Flushed Error",
        WcStatus::RemAccessErr => "remote access error",
        WcStatus::RemInvReqErr => "remote invalid request error",
        WcStatus::RemOpErr => "remote operation error",
        WcStatus::RetryExcErr => "transport retry counter exceeded",
        WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
        WcStatus::BadRespErr => "bad response error",
        WcStatus::GeneralErr => "general error",
    }
}

/// Names of completion opcodes.
pub fn wc_opcode_name(o: WcOpcode) -> &'static str {
    match o {
        WcOpcode::Send => "send",
        WcOpcode::RdmaWrite => "rdma-write",
        WcOpcode::RdmaRead => "rdma-read",
        WcOpcode::CompSwap => "cmp-swap",
        WcOpcode::FetchAdd => "fetch-add",
        WcOpcode::Recv => "recv",
        WcOpcode::RecvRdmaWithImm => "recv-rdma-with-imm",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::transport::qp::QpState;
    use dataplane::transport::rc::PostError;

    #[test]
    fn a_shards_refusals_keep_their_kind_and_code() {
        let r = |e: DeviceError| {
            let r = RdmaError::from(e);
            (r.kind, r.code)
        };
        assert_eq!(r(DeviceError::NoQp(7)), (Refusal::NotFound, "not_found"));
        assert_eq!(
            r(DeviceError::CqInUse { cqn: 3, users: 2 }),
            (Refusal::Conflict, "cq_busy")
        );
        assert_eq!(
            r(DeviceError::Post(PostError::BadState)),
            (Refusal::Conflict, "post_refused")
        );
        assert_eq!(
            r(DeviceError::Mr(MrError::InvalidKey)),
            (Refusal::NotFound, "not_found")
        );
        // One QP of a bulk call refused: its own refusal, named.
        let m = RdmaError::from(DeviceError::Member {
            qpn: 0x12,
            source: Box::new(DeviceError::Modify(ModifyError::Missing("path"))),
        });
        assert_eq!((m.kind, m.code), (Refusal::Invalid, "bad_attr"));
        assert_eq!(m.message, "QP 18: the transition needs path");
        // An attribute out of range is the request's fault; a transition the state does not
        // allow is the state's.
        assert_eq!(
            r(DeviceError::Modify(ModifyError::Invalid("max_rd_atomic"))),
            (Refusal::Invalid, "bad_attr")
        );
        assert_eq!(
            r(DeviceError::Modify(ModifyError::BadTransition {
                from: QpState::Reset,
                to: QpState::Rts
            })),
            (Refusal::Conflict, "bad_state")
        );
    }
}
