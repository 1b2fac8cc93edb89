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
use dataplane::transport::device::{CqState, QpQuery};
use dataplane::transport::mr::{Access, MrError, MrTable, PdHandle};
use dataplane::transport::perftest::{LatKind, LatResult, Reply, StreamResult};
use dataplane::transport::qp::{Mtu, Path, QpAttr, QpState, QpType};
use dataplane::transport::rc::{Connect, QpCaps};
use dataplane::transport::wr::{RecvWr, SendWr, UdDest};
use dataplane::wire::Psn;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long the control plane waits for an lcore's answer.
const LCORE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connect waits for the remote GID's MAC.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);
/// QPs a node holds at most (a device's max_qp).
pub const MAX_QPS: usize = 1 << 18;
/// QPs one lcore command creates at most (a bulk create sends several).
const BULK_CHUNK: usize = 1024;
/// Largest region one registration may ask for.
pub const MAX_MR_BYTES: usize = 1 << 30;

/// Why an operation was refused; `status` is the HTTP status the API answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// What went wrong, for people.
    pub message: String,
}

impl ApiError {
    /// 400: the request itself is wrong.
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            code,
            message: message.into(),
        }
    }
    /// 404: no such object.
    pub fn not_found(what: impl Into<String>) -> Self {
        ApiError {
            status: 404,
            code: "not_found",
            message: what.into(),
        }
    }
    /// 409: the object's state does not allow it.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: 409,
            code,
            message: message.into(),
        }
    }
    /// 503/500: the node could not do it.
    pub fn internal(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: if code == "lcore_unavailable" {
                503
            } else {
                500
            },
            code,
            message: message.into(),
        }
    }
}

fn mr_error(e: MrError) -> ApiError {
    match e {
        MrError::InvalidKey => ApiError::not_found("no memory region with that key"),
        MrError::OutOfBounds => ApiError::bad("out_of_bounds", "the range is outside the region"),
        MrError::BadAccessFlags => ApiError::bad(
            "bad_access",
            "remote-write and remote-atomic access need local-write",
        ),
        MrError::TooMany => ApiError::conflict("too_many", "too many memory regions"),
        other => ApiError::bad("mr", other.to_string()),
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
pub fn parse_access(names: &[String]) -> Result<Access, ApiError> {
    let mut a = Access::NONE;
    for n in names {
        let Some((_, f)) = ACCESS_NAMES.iter().find(|(k, _)| k == n) else {
            return Err(ApiError::bad(
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

/// What connecting a QP needs to know of its peer.
#[derive(Clone, Debug)]
pub struct ConnectRequest {
    /// The remote QP number.
    pub remote_qpn: u32,
    /// The remote GID (IPv4, IPv4-mapped IPv6, or IPv6).
    pub remote_gid: IpAddr,
    /// First PSN the remote sends (our rq_psn): needed to connect an RC QP (RTR).
    pub remote_psn: Option<u32>,
    /// First PSN we send (our sq_psn); None: the random one the QP was created with.
    pub local_psn: Option<u32>,
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout code (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Retries (0-7).
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// RNR NAK timer code we send.
    pub min_rnr_timer: u8,
    /// READs/atomics outstanding at most, each way.
    pub max_rd_atomic: u8,
    /// Remote access the QP allows.
    pub access: Access,
    /// DSCP of its packets.
    pub dscp: u8,
    /// A UD QP's Q_Key (INIT).
    pub qkey: Option<u32>,
    /// A UD QP's port (INIT).
    pub port: usize,
}

/// The connect a request asks for, on `path`, with the PSNs `Rdma::psns` settled.
fn connect_of(path: Path, r: &ConnectRequest, (sq_psn, rq_psn): (u32, u32)) -> Connect {
    Connect {
        access: r.access,
        sq_psn,
        rq_psn,
        timeout: r.timeout,
        retry_cnt: r.retry_cnt,
        rnr_retry: r.rnr_retry,
        min_rnr_timer: r.min_rnr_timer,
        max_rd_atomic: r.max_rd_atomic,
        max_dest_rd_atomic: r.max_rd_atomic,
        ..Connect::new(path, r.mtu, r.remote_qpn)
    }
}

/// Refuses QPNs and PSNs past 24 bits.
fn check_24bit(r: &ConnectRequest) -> Result<(), ApiError> {
    let big = |p: Option<u32>| p.is_some_and(|p| p > 0xff_ffff);
    if r.remote_qpn > 0xff_ffff || big(r.remote_psn) || big(r.local_psn) {
        return Err(ApiError::bad(
            "bad_attr",
            "QPNs and PSNs are 24-bit (at most 16777215)",
        ));
    }
    Ok(())
}

/// The peer's first PSN, which an RC QP cannot be connected without (PSNs start at random).
fn remote_psn(r: &ConnectRequest) -> Result<u32, ApiError> {
    r.remote_psn.ok_or_else(|| {
        ApiError::bad(
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
}

/// QP `qpn`'s entry in the QP table, or 404.
fn meta(t: &BTreeMap<u32, QpMeta>, qpn: u32) -> Result<&QpMeta, ApiError> {
    t.get(&qpn)
        .ok_or_else(|| ApiError::not_found(format!("no QP {qpn}")))
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
    /// Per port: its GID table (as rxe builds one: the link-local GID from the MAC, then
    /// each IPv4 address IPv4-mapped, then each IPv6 address).
    gids: Vec<Vec<std::net::Ipv6Addr>>,
    line_bps: f64,
}

impl core::fmt::Debug for Rdma {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Rdma")
            .field("lcores", &self.lcores.len())
            .finish()
    }
}

/// Parses a GID: IPv4, IPv6, or IPv4-mapped IPv6 (which means the IPv4 address).
pub fn parse_gid(s: &str) -> Result<IpAddr, ApiError> {
    s.parse::<IpAddr>()
        .map(|a| a.to_canonical())
        .map_err(|_| ApiError::bad("bad_gid", format!("{s:?} is not an IPv4 or IPv6 GID")))
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
            line_bps,
        }
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
    ) -> Result<T, ApiError> {
        let (tx, rx) = bounded(1);
        self.lcores[lcore]
            .send(Command::Handler(ApplianceCommand::Rdma(RdmaCommand::call(
                tx, f,
            ))))
            .map_err(|_| ApiError::internal("lcore_unavailable", "the lcore has stopped"))?;
        rx.recv_timeout(LCORE_TIMEOUT).map_err(|_| {
            ApiError::internal(
                "lcore_unavailable",
                format!("lcore {lcore} did not answer in {LCORE_TIMEOUT:?}"),
            )
        })
    }

    // ---- protection domains ----

    /// Allocates a protection domain on every lcore.
    pub fn alloc_pd(&self) -> Result<PdInfo, ApiError> {
        let mut mrs = self.mrs.lock().expect("mr table");
        if mrs.pds.len() >= MAX_PDS {
            return Err(ApiError::conflict(
                "too_many",
                format!("the node holds {MAX_PDS} protection domains already"),
            ));
        }
        let pd = mrs.table.alloc_pd().0;
        for l in 0..self.lcores.len() {
            self.ask(l, move |h, _| h.dev.alloc_pd(pd))?;
        }
        mrs.pds.insert(pd);
        Ok(PdInfo {
            pdn: pd,
            mrs: 0,
            qps: 0,
        })
    }

    /// Every protection domain with what is in it.
    pub fn list_pds(&self) -> Vec<PdInfo> {
        let mrs = self.mrs.lock().expect("mr table");
        let qps = self.qps.lock().expect("qp table");
        mrs.pds
            .iter()
            .map(|&pdn| PdInfo {
                pdn,
                mrs: mrs.meta.values().filter(|e| e.info.pdn == pdn).count(),
                qps: qps.values().filter(|q| q.pd == pdn).count(),
            })
            .collect()
    }

    /// One protection domain.
    pub fn show_pd(&self, pdn: u32) -> Result<PdInfo, ApiError> {
        self.list_pds()
            .into_iter()
            .find(|p| p.pdn == pdn)
            .ok_or_else(|| ApiError::not_found(format!("no protection domain {pdn}")))
    }

    /// Frees a protection domain: refused for the default one and while regions or QPs are
    /// in it.
    pub fn dealloc_pd(&self, pdn: u32) -> Result<(), ApiError> {
        let p = self.show_pd(pdn)?;
        let mut mrs = self.mrs.lock().expect("mr table");
        if pdn == mrs.pd.0 {
            return Err(ApiError::conflict(
                "default_pd",
                format!("PD {pdn} is the node's default protection domain and stays"),
            ));
        }
        if p.mrs > 0 || p.qps > 0 {
            return Err(ApiError::conflict(
                "pd_busy",
                format!(
                    "PD {pdn} still holds {} memory regions and {} QPs: deregister and destroy them first",
                    p.mrs, p.qps
                ),
            ));
        }
        mrs.table.dealloc_pd(PdHandle(pdn)).map_err(mr_error)?;
        mrs.pds.remove(&pdn);
        for l in 0..self.lcores.len() {
            // Nothing of this PD is left anywhere (checked above), so no lcore refuses.
            let _ = self.ask(l, move |h, _| h.dev.dealloc_pd(pdn))?;
        }
        Ok(())
    }

    /// The PD `pd` names (None: the default), if it exists.
    fn pd_or_default(&self, pd: Option<u32>) -> Result<u32, ApiError> {
        let mrs = self.mrs.lock().expect("mr table");
        let pd = pd.unwrap_or(mrs.pd.0);
        if mrs.pds.contains(&pd) {
            Ok(pd)
        } else {
            Err(ApiError::bad(
                "no_pd",
                format!("no protection domain {pd}: create one with POST /v1/pds"),
            ))
        }
    }

    // ---- completion queues ----

    /// Creates a CQ for `cqe` completions on `lcore` (or the lcore with fewest QPs).
    pub fn create_cq(&self, cqe: usize, lcore: Option<usize>) -> Result<CqInfo, ApiError> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(ApiError::bad(
                "bad_cqe",
                format!("cqe must be 1 to {MAX_CQE}, not {cqe}"),
            ));
        }
        let lcore = self.pick_lcore(lcore, &self.qps.lock().expect("qp table"))?;
        let mut cqs = self.cqs.lock().expect("cq table");
        let total: usize = cqs.values().map(|c| c.1).sum();
        if total + cqe > MAX_CQE_TOTAL {
            return Err(ApiError::conflict(
                "too_many",
                format!(
                    "the node's CQs hold {total} entries of {MAX_CQE_TOTAL}: {cqe} more do not fit"
                ),
            ));
        }
        let cqn = self
            .ask(lcore, move |h, _| h.dev.create_cq(cqe))?
            .map_err(|e| ApiError::conflict("too_many", e.to_string()))?;
        cqs.insert(cqn, (lcore, cqe));
        Ok(CqInfo {
            cqn,
            lcore,
            cqe,
            waiting: 0,
            users: 0,
            in_error: false,
        })
    }

    fn cq_lcore(&self, cqn: u32) -> Result<usize, ApiError> {
        self.cqs
            .lock()
            .expect("cq table")
            .get(&cqn)
            .map(|c| c.0)
            .ok_or_else(|| ApiError::not_found(format!("no CQ {cqn}")))
    }

    /// Every created CQ.
    pub fn list_cqs(&self) -> Result<Vec<CqInfo>, ApiError> {
        let cqns: Vec<u32> = self.cqs.lock().expect("cq table").keys().copied().collect();
        let mut all = Vec::new();
        for cqn in cqns {
            match self.poll_cqn(cqn, 0, Duration::ZERO) {
                Ok((_, info)) => all.push(info),
                Err(e) if e.status == 404 => {} // destroyed meanwhile
                Err(e) => return Err(e),
            }
        }
        Ok(all)
    }

    /// Takes up to `max` completions from a created CQ, waiting up to `wait` for the first;
    /// with the CQ's state after.
    pub fn poll_cqn(
        &self,
        cqn: u32,
        max: usize,
        wait: Duration,
    ) -> Result<(Vec<WorkCompletion>, CqInfo), ApiError> {
        let l = self.cq_lcore(cqn)?;
        let deadline = Instant::now() + wait;
        loop {
            let (wcs, st): (Vec<WorkCompletion>, CqState) = self
                .ask(l, move |h, _| h.dev.poll_cqn(cqn, max))?
                .ok_or_else(|| ApiError::not_found(format!("no CQ {cqn}")))?;
            if !wcs.is_empty() || max == 0 || Instant::now() >= deadline {
                let info = CqInfo {
                    cqn,
                    lcore: l,
                    cqe: st.cqe,
                    waiting: st.waiting,
                    users: st.users,
                    in_error: st.in_error,
                };
                return Ok((wcs, info));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Destroys a CQ; refused while a QP uses it.
    pub fn destroy_cq(&self, cqn: u32) -> Result<(), ApiError> {
        // The table stays locked from the look-up until the entry is gone: the lcore frees
        // the number as it destroys the CQ, and a create that reuses it must not be unlinked
        // by this removal (nor a second destroy of this number reach the new CQ).
        let mut cqs = self.cqs.lock().expect("cq table");
        let l = cqs
            .get(&cqn)
            .map(|c| c.0)
            .ok_or_else(|| ApiError::not_found(format!("no CQ {cqn}")))?;
        self.ask(l, move |h, _| h.dev.destroy_cq(cqn))?
            .map_err(|e| ApiError::conflict("cq_busy", format!("{e}: destroy those QPs first")))?;
        cqs.remove(&cqn);
        Ok(())
    }

    // ---- memory regions ----

    /// Registers `length` zeroed bytes with `access`, at `addr` or at the memory's own
    /// address, in protection domain `pd` (None: the default), on every lcore.
    pub fn reg_mr(
        &self,
        length: usize,
        access: Access,
        addr: Option<u64>,
        pd: Option<u32>,
    ) -> Result<MrInfo, ApiError> {
        let pd = PdHandle(self.pd_or_default(pd)?);
        if length == 0 || length > MAX_MR_BYTES {
            return Err(ApiError::bad(
                "bad_length",
                format!("length must be 1 to {MAX_MR_BYTES} bytes, not {length}"),
            ));
        }
        let mem = (self.alloc)(length).map_err(|e| {
            ApiError::conflict(
                "no_memory",
                format!("the node's hugepage memory cannot hold {length} more bytes now: {e}"),
            )
        })?;
        let va = addr.unwrap_or(mem.addr());
        let mut mrs = self.mrs.lock().expect("mr table");
        let key = mrs
            .table
            .register(pd, va, Box::new(mem.clone()), access)
            .map_err(mr_error)?;
        let mut done = Vec::new();
        for l in 0..self.lcores.len() {
            let r = self
                .ask(l, {
                    let mem = Box::new(mem.clone());
                    move |h, _| h.dev.reg_shared(key, pd.0, va, access, mem)
                })
                .and_then(|r| r.map_err(mr_error));
            if let Err(err) = r {
                for d in done {
                    let _ = self.ask(d, move |h, _| h.dev.dereg_mr(key));
                }
                let _ = mrs.table.deregister(key);
                return Err(err);
            }
            done.push(l);
        }
        let info = MrInfo {
            lkey: key,
            rkey: key,
            addr: va,
            length,
            access: access_names(access),
            hugepage: mem.is_hugepage(),
            pdn: pd.0,
        };
        mrs.meta.insert(key, MrEntry { info: info.clone() });
        Ok(info)
    }

    /// Every region.
    pub fn list_mrs(&self) -> Vec<MrInfo> {
        let mrs = self.mrs.lock().expect("mr table");
        mrs.meta.values().map(|e| e.info.clone()).collect()
    }

    /// One region.
    pub fn show_mr(&self, key: u32) -> Result<MrInfo, ApiError> {
        let mrs = self.mrs.lock().expect("mr table");
        mrs.meta
            .get(&key)
            .map(|e| e.info.clone())
            .ok_or_else(|| ApiError::not_found(format!("no memory region with key {key:#x}")))
    }

    /// Deregisters a region on every lcore.
    pub fn dereg_mr(&self, key: u32) -> Result<(), ApiError> {
        let mut mrs = self.mrs.lock().expect("mr table");
        if !mrs.meta.contains_key(&key) {
            return Err(ApiError::not_found(format!(
                "no memory region with key {key:#x}"
            )));
        }
        for l in 0..self.lcores.len() {
            // An lcore that lost the region already is fine: the goal is that none has it.
            let _ = self.ask(l, move |h, _| h.dev.dereg_mr(key))?;
        }
        let _ = mrs.table.deregister(key);
        mrs.meta.remove(&key);
        Ok(())
    }

    /// Reads `len` bytes of a region at `addr` (its own address space).
    pub fn read_mr(&self, key: u32, addr: u64, len: usize) -> Result<Vec<u8>, ApiError> {
        if len > MAX_MR_BYTES {
            return Err(ApiError::bad("bad_length", "too many bytes at once"));
        }
        let mrs = self.mrs.lock().expect("mr table");
        mrs.table
            .get(key)
            .and_then(|m| m.to_vec(addr, len))
            .map_err(mr_error)
    }

    /// Writes bytes into a region at `addr`.
    pub fn write_mr(&self, key: u32, addr: u64, data: &[u8]) -> Result<(), ApiError> {
        let mut mrs = self.mrs.lock().expect("mr table");
        mrs.table
            .get_mut(key)
            .and_then(|m| m.write(addr, data))
            .map_err(mr_error)
    }

    // ---- queue pairs ----

    /// `lcore` if it exists, else the lcore with fewest QPs.
    fn pick_lcore(
        &self,
        lcore: Option<usize>,
        qps: &BTreeMap<u32, QpMeta>,
    ) -> Result<usize, ApiError> {
        Ok(match lcore {
            Some(l) if l >= self.lcores.len() => {
                return Err(ApiError::bad(
                    "bad_lcore",
                    format!(
                        "lcore {l} does not exist: this node has 0 to {}",
                        self.lcores.len() - 1
                    ),
                ));
            }
            Some(l) => l,
            None => {
                let mut count = vec![0usize; self.lcores.len()];
                for m in qps.values() {
                    count[m.lcore] += 1;
                }
                (0..count.len()).min_by_key(|&l| count[l]).unwrap_or(0)
            }
        })
    }

    /// Creates an RC QP in RESET in protection domain `opts.pd` (None: the default), its
    /// completions going to the created CQs `opts.cqs` (None: CQs of its own), on `lcore`
    /// (or the lcore of its CQs, or the lcore with fewest QPs): its QPN, lcore and the random
    /// PSN it will start sending with.
    pub fn create_qp(
        &self,
        lcore: Option<usize>,
        caps: QpCaps,
        opts: QpPlacement,
        cc: CcKind,
        params: DcqcnParams,
    ) -> Result<(u32, usize, u32), ApiError> {
        params
            .validate()
            .map_err(|e| ApiError::bad("bad_cc", e.to_string()))?;
        let pd = self.pd_or_default(opts.pd)?;
        // A QP lives on the lcore of its CQs (completions are never handed between lcores).
        let mut cq_lcore = None;
        for cqn in opts.cqs.into_iter().flatten() {
            let l = self.cq_lcore(cqn).map_err(|_| {
                ApiError::bad(
                    "no_cq",
                    format!("no CQ {cqn}: create one with POST /v1/cqs"),
                )
            })?;
            match (cq_lcore, lcore) {
                (Some(o), _) if o != l => {
                    return Err(ApiError::bad(
                        "bad_cq",
                        "a QP's send and receive CQs must live on the same lcore",
                    ));
                }
                (_, Some(want)) if want != l => {
                    return Err(ApiError::bad(
                        "bad_cq",
                        format!(
                            "CQ {cqn} lives on lcore {l}, not on lcore {want}: a QP lives with its CQs"
                        ),
                    ));
                }
                _ => cq_lcore = Some(l),
            }
        }
        let mut qps = self.qps.lock().expect("qp table");
        if qps.len() >= MAX_QPS {
            return Err(ApiError::conflict(
                "too_many",
                format!("the node holds {MAX_QPS} QPs already"),
            ));
        }
        let lcore = match cq_lcore {
            Some(l) => l,
            None => self.pick_lcore(lcore, &qps)?,
        };
        let qpn = self
            .ask(lcore, move |h, _| {
                h.dev.create_qp(caps, Some(pd), opts.cqs, cc, params)
            })?
            .map_err(|e| ApiError::bad("bad_caps", e.to_string()))?;
        let psn = random_psn();
        qps.insert(
            qpn,
            QpMeta {
                lcore,
                pd,
                cqs: opts.cqs,
                psn,
            },
        );
        Ok((qpn, lcore, psn))
    }

    /// Creates `count` RC QPs in RESET on one lcore (`lcore`, or the least loaded), all or
    /// none: a perftest run with several QPs.
    pub fn create_qps(
        &self,
        lcore: Option<usize>,
        count: usize,
        caps: QpCaps,
        cc: CcKind,
        params: DcqcnParams,
    ) -> Result<(Vec<u32>, usize), ApiError> {
        params
            .validate()
            .map_err(|e| ApiError::bad("bad_cc", e.to_string()))?;
        // The region table's lock before the QP table's, never after (list_pds takes both
        // in that order).
        let pd = self.pd_or_default(None)?;
        let mut qps = self.qps.lock().expect("qp table");
        if qps.len() + count > MAX_QPS {
            return Err(ApiError::conflict(
                "too_many",
                format!(
                    "the node holds {} QPs of {MAX_QPS}: {count} more do not fit",
                    qps.len()
                ),
            ));
        }
        let lcore = self.pick_lcore(lcore, &qps)?;
        // In chunks, so the lcore never stops polling its queues for long.
        let mut made: Vec<u32> = Vec::with_capacity(count);
        while made.len() < count {
            let n = (count - made.len()).min(BULK_CHUNK);
            let r = self
                .ask(lcore, move |h, _| h.dev.create_qps(n, caps, cc, params))
                .and_then(|r| r.map_err(|e| ApiError::bad("bad_caps", e.to_string())));
            match r {
                Ok(q) => made.extend(q),
                Err(e) => {
                    for &q in &made {
                        let _ = self.ask(lcore, move |h, _| h.dev.destroy_qp(q));
                    }
                    return Err(e);
                }
            }
        }
        for &qpn in &made {
            qps.insert(
                qpn,
                QpMeta {
                    lcore,
                    pd,
                    cqs: [None; 2],
                    psn: random_psn(),
                },
            );
        }
        Ok((made, lcore))
    }

    /// Connects several QPs (each `(qpn, request)`) towards one remote GID, all or none: the
    /// path is resolved once, and each lcore takes its QPs in chunks.
    pub fn connect_qps(&self, list: &[(u32, ConnectRequest)]) -> Result<(), ApiError> {
        let Some((q0, r0)) = list.first() else {
            return Ok(());
        };
        if list.iter().any(|(_, r)| r.remote_gid != r0.remote_gid) {
            return Err(ApiError::bad(
                "bad_attr",
                "a bulk connect goes to one remote GID",
            ));
        }
        let (path, port) = self.path_for(*q0, r0)?;
        let mut by_lcore: BTreeMap<usize, Vec<(u32, Connect)>> = BTreeMap::new();
        for (qpn, r) in list {
            check_24bit(r)?;
            let psns = self.psns(*qpn, r)?;
            let l = self.lcore_of(*qpn)?;
            let p = Path {
                udp_sport: udp_sport(*qpn, path.local_ip, r.remote_gid, r.remote_qpn),
                ..path
            };
            by_lcore
                .entry(l)
                .or_default()
                .push((*qpn, connect_of(p, r, psns)));
        }
        let mut done: Vec<(usize, Vec<u32>)> = Vec::new();
        for (l, all) in by_lcore {
            for chunk in all.chunks(BULK_CHUNK) {
                let qpns: Vec<u32> = chunk.iter().map(|c| c.0).collect();
                let r = self
                    .ask(l, {
                        let list = chunk.to_vec();
                        move |h, _| h.dev.connect_many(&list, port)
                    })
                    .and_then(|r| r.map_err(|e| ApiError::conflict("bad_state", e.to_string())));
                if let Err(e) = r {
                    for (l, qs) in &done {
                        for q in qs {
                            let reset = QpAttr {
                                state: Some(QpState::Reset),
                                ..Default::default()
                            };
                            let q = *q;
                            let _ = self.ask(*l, move |h, _| h.dev.modify(q, &reset, port));
                        }
                    }
                    return Err(e);
                }
                done.push((l, qpns));
            }
        }
        Ok(())
    }

    /// Destroys several QPs: none if one of them does not exist.
    pub fn destroy_qps(&self, qpns: &[u32]) -> Result<(), ApiError> {
        // Locked throughout, as in `destroy_qp`.
        let mut t = self.qps.lock().expect("qp table");
        let mut by_lcore: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for &q in qpns {
            by_lcore.entry(meta(&t, q)?.lcore).or_default().push(q);
        }
        for (l, all) in by_lcore {
            for chunk in all.chunks(BULK_CHUNK) {
                let qs = chunk.to_vec();
                self.ask(l, move |h, _| h.dev.destroy_qps(&qs))?;
                for q in chunk {
                    t.remove(q);
                }
            }
        }
        Ok(())
    }

    /// Streams on several QPs of one lcore at once (see `Tests::streams`).
    pub fn streams(
        &self,
        qps: Vec<(u32, SendWr)>,
        count: u64,
        depth: usize,
        duration: Option<Duration>,
        wait: Duration,
    ) -> Result<StreamResult, ApiError> {
        let first = self.one_lcore(qps.iter().map(|q| q.0), "stream")?;
        let codes = ("stream_refused", "stream_ended");
        self.run_test(first, "stream", codes, wait, move |h, now, reply| {
            let shape = (count, depth, duration);
            h.tests.streams(&mut h.dev, now, qps, shape, reply)
        })
    }

    /// The first of `qpns`, which must all live on one lcore (a several-QP `what` runs there).
    fn one_lcore(&self, mut qpns: impl Iterator<Item = u32>, what: &str) -> Result<u32, ApiError> {
        let first = qpns
            .next()
            .ok_or_else(|| ApiError::bad("bad_wr", "no QPs"))?;
        let l = self.lcore_of(first)?;
        for q in qpns {
            if self.lcore_of(q)? != l {
                return Err(ApiError::bad(
                    "bad_wr",
                    format!("a several-QP {what} runs on one lcore: its QPs must share it"),
                ));
            }
        }
        Ok(first)
    }

    fn lcore_of(&self, qpn: u32) -> Result<usize, ApiError> {
        Ok(meta(&self.qps.lock().expect("qp table"), qpn)?.lcore)
    }

    /// Every QP's number.
    pub fn qpns(&self) -> Vec<u32> {
        self.qps.lock().expect("qp table").keys().copied().collect()
    }

    /// Changes a QP's congestion control (see `Device::set_cc`).
    pub fn set_cc(
        &self,
        qpn: u32,
        kind: Option<CcKind>,
        params: DcqcnParams,
    ) -> Result<(), ApiError> {
        let l = self.lcore_of(qpn)?;
        self.ask(l, move |h, _| h.dev.set_cc(qpn, kind, params))?
            .map_err(|e| ApiError::not_found(e.to_string()))
    }

    /// A QP's attributes and counters.
    pub fn query_qp(&self, qpn: u32) -> Result<(usize, QpQuery), ApiError> {
        let l = self.lcore_of(qpn)?;
        let mut q = self
            .ask(l, move |h, now| h.dev.query(qpn, now))?
            .ok_or_else(|| ApiError::not_found(format!("no QP {qpn}")))?;
        if matches!(q.cfg.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            // Before RTS its send PSN is the one it will start with unless told another.
            q.cfg.sq_psn = Psn::new(self.local_psn(qpn, None)?);
        }
        Ok((l, q))
    }

    /// Every QP's lcore, attributes and counters, in QPN order: one round trip per lcore
    /// (not per QP: a node holds up to [`MAX_QPS`]).
    pub fn list_qps(&self) -> Result<Vec<(u32, usize, QpQuery)>, ApiError> {
        let mut all = Vec::new();
        for l in 0..self.lcores.len() {
            let qs = self.ask(l, |h, now| h.dev.query_all(now))?;
            all.extend(qs.into_iter().map(|(qpn, q)| (qpn, l, q)));
        }
        let t = self.qps.lock().expect("qp table");
        // Only QPs the node knows (one being created is not listed until it is).
        all.retain(|(qpn, _, _)| t.contains_key(qpn));
        for (qpn, _, q) in all.iter_mut() {
            if matches!(q.cfg.state, QpState::Reset | QpState::Init | QpState::Rtr) {
                // As in `query_qp`: before RTS its send PSN is the one it will start with.
                q.cfg.sq_psn = Psn::new(t[qpn].psn);
            }
        }
        all.sort_by_key(|(qpn, _, _)| *qpn);
        Ok(all)
    }

    /// Destroys a QP.
    pub fn destroy_qp(&self, qpn: u32) -> Result<(), ApiError> {
        // As for CQs: the table is locked from the look-up until the entry is gone, so a
        // create that reuses the freed number is never unlinked.
        let mut qps = self.qps.lock().expect("qp table");
        let l = meta(&qps, qpn)?.lcore;
        self.ask(l, move |h, _| h.dev.destroy_qp(qpn))?;
        qps.remove(&qpn);
        Ok(())
    }

    /// Port, source address, next hop's MAC and VLAN towards `gid`, resolving the next hop
    /// if needed.
    fn resolve(&self, gid: IpAddr) -> Result<Resolved, ApiError> {
        let (port, hop, local, vlan) = {
            let r = self.routes.lock().expect("routes");
            let (port, hop) = r.route(gid, None).ok_or_else(|| {
                ApiError::bad(
                    "no_route",
                    format!(
                        "no port or route reaches {gid}: check the ports' addresses and [[routes]]"
                    ),
                )
            })?;
            let local = r.source_ip(port, gid).ok_or_else(|| {
                ApiError::bad(
                    "no_source",
                    format!(
                        "port {port} has no {} address",
                        if gid.is_ipv4() { "IPv4" } else { "IPv6" }
                    ),
                )
            })?;
            (port, hop, local, r.vlan(port))
        };
        let deadline = Instant::now() + RESOLVE_TIMEOUT;
        let mut asked = false;
        let mut n = self.neigh.lock().expect("neighbour table");
        loop {
            if let Some(mac) = n.get(&(port, hop)) {
                return Ok((port, local, *mac, vlan));
            }
            if !asked {
                asked = true;
                let _ = self.lcores[0].send(Command::Handler(ApplianceCommand::Net(
                    dataplane::net::NetCommand::Resolve { dst: gid },
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ApiError::conflict(
                    "unresolved",
                    format!(
                        "{hop} (next hop to {gid}) did not answer ARP/ND in {RESOLVE_TIMEOUT:?}"
                    ),
                ));
            }
            n = self
                .resolved
                .wait_timeout(n, deadline - now)
                .expect("neighbour table")
                .0;
        }
    }

    /// Sets the ports' MTUs (IP packet bytes), which bound the path MTU a QP may connect with.
    pub fn with_port_mtus(mut self, mtus: Vec<u16>) -> Self {
        self.mtus = mtus;
        self
    }

    /// The path of QP `qpn` to its peer: checks the 24-bit numbers, resolves the GID to a
    /// port and next hop, checks the path MTU fits the port, picks the UDP source port.
    fn path_for(&self, qpn: u32, r: &ConnectRequest) -> Result<(Path, usize), ApiError> {
        check_24bit(r)?;
        let (port, local, mac, vlan) = self.resolve(r.remote_gid)?;
        if let Some(&port_mtu) = self.mtus.get(port) {
            // The largest packet of the path MTU: IP and UDP headers, BTH, the longest
            // extension headers a full segment carries (RETH + ImmDt), payload, ICRC.
            let ip = if r.remote_gid.is_ipv4() { 20 } else { 40 };
            let need = |m: u32| ip + 8 + 12 + 20 + m + 4;
            if need(r.mtu.bytes()) > port_mtu as u32 {
                let fits = [4096u32, 2048, 1024, 512, 256]
                    .into_iter()
                    .find(|m| need(*m) <= port_mtu as u32);
                return Err(ApiError::bad(
                    "bad_mtu",
                    format!(
                        "path MTU {} does not fit port {port}'s MTU {port_mtu} ({} byte packets); {}",
                        r.mtu.bytes(),
                        need(r.mtu.bytes()),
                        match fits {
                            Some(m) => format!("use {m} or less, or raise the port's mtu"),
                            None => "raise the port's mtu".into(),
                        }
                    ),
                ));
            }
        }
        let path = Path {
            local_ip: local,
            remote_ip: r.remote_gid,
            local_mac: self.macs[port].0,
            remote_mac: mac.0,
            udp_sport: udp_sport(qpn, local, r.remote_gid, r.remote_qpn),
            dscp: r.dscp,
            ecn: 2,
            vlan,
        };
        Ok((path, port))
    }

    /// The PSN QP `qpn` starts sending with: the request's, or the one it was created with.
    fn local_psn(&self, qpn: u32, given: Option<u32>) -> Result<u32, ApiError> {
        match given {
            Some(p) => Ok(p),
            None => Ok(meta(&self.qps.lock().expect("qp table"), qpn)?.psn),
        }
    }

    /// (our first PSN, the peer's first PSN) for connecting QP `qpn`.
    fn psns(&self, qpn: u32, r: &ConnectRequest) -> Result<(u32, u32), ApiError> {
        Ok((self.local_psn(qpn, r.local_psn)?, remote_psn(r)?))
    }

    /// Takes a QP from RESET to RTS towards its peer.
    pub fn connect_qp(&self, qpn: u32, r: &ConnectRequest) -> Result<(), ApiError> {
        let l = self.lcore_of(qpn)?;
        if self.qp_type(qpn)? == QpType::Ud {
            return Err(ApiError::conflict(
                "bad_state",
                dataplane::transport::qp::ModifyError::Datagram.to_string(),
            ));
        }
        let (path, port) = self.path_for(qpn, r)?;
        let c = connect_of(path, r, self.psns(qpn, r)?);
        self.ask(l, move |h, _| h.dev.connect(qpn, &c, port))?
            .map_err(|e| ApiError::conflict("bad_state", e.to_string()))
    }

    /// A QP's type (RC or UD).
    pub fn qp_type(&self, qpn: u32) -> Result<QpType, ApiError> {
        Ok(self.query_qp(qpn)?.1.cfg.qp_type)
    }

    /// The largest IB MTU whose UD datagrams (IPv6, UDP, BTH, DETH, ImmDt, payload, ICRC) fit
    /// `port`'s MTU: what a UD QP on it may send at most (verbs' active_mtu).
    pub fn ud_mtu(&self, port: usize) -> Mtu {
        let port_mtu = self.mtus.get(port).map_or(1500, |&m| m as u32);
        [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512]
            .into_iter()
            .find(|m| 40 + 8 + 12 + 8 + 4 + m.bytes() + 4 <= port_mtu)
            .unwrap_or(Mtu::M256)
    }

    /// Where a UD send from `qpn` to `remote_qpn` at `gid` goes: the GID resolved (ARP/ND) to
    /// a next hop of the QP's port, the UDP source port chosen as for RC; Not-ECT, DSCP 0 (no
    /// congestion control for datagrams), as rxe sends them.
    pub fn ud_dest(
        &self,
        qpn: u32,
        gid: IpAddr,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<UdDest, ApiError> {
        let (_, q) = self.query_qp(qpn)?;
        if q.cfg.qp_type != QpType::Ud {
            return Err(ApiError::bad(
                "bad_wr",
                format!("QP {qpn} is RC: its sends go to its connected peer and take no ud"),
            ));
        }
        if remote_qpn > 0xff_ffff {
            return Err(ApiError::bad("bad_wr", "remote_qpn is 24-bit"));
        }
        let (port, local, mac, vlan) = self.resolve(gid)?;
        if port != q.port {
            return Err(ApiError::bad(
                "bad_wr",
                format!(
                    "{gid} is reached by port {port}, and QP {qpn} sends by port {}",
                    q.port
                ),
            ));
        }
        Ok(UdDest {
            path: Path {
                local_ip: local,
                remote_ip: gid,
                local_mac: self.macs[port].0,
                remote_mac: mac.0,
                udp_sport: udp_sport(qpn, local, gid, remote_qpn),
                dscp: 0,
                ecn: 0,
                vlan,
            },
            dest_qp: remote_qpn,
            qkey,
        })
    }

    /// One verbs transition of QP `qpn` to `state`, with the attributes that transition takes
    /// from `r` (INIT: access, P_Key index 0; RTR: path, remote QPN and PSN, MTU, min_rnr_timer,
    /// max_dest_rd_atomic; RTS: our PSN, timeout, retry_cnt, rnr_retry, max_rd_atomic). A UD
    /// QP takes its Q_Key, port and the port's MTU at INIT, nothing at RTR, our PSN at RTS.
    pub fn modify_qp(&self, qpn: u32, state: QpState, r: &ConnectRequest) -> Result<(), ApiError> {
        let l = self.lcore_of(qpn)?;
        let mut attr = QpAttr {
            state: Some(state),
            ..Default::default()
        };
        let mut port = 0;
        if self.qp_type(qpn)? == QpType::Ud {
            match state {
                QpState::Init => {
                    if r.port >= self.macs.len() {
                        return Err(ApiError::bad(
                            "bad_attr",
                            format!("port {} does not exist", r.port),
                        ));
                    }
                    port = r.port;
                    attr.pkey_index = Some(0);
                    attr.qkey = Some(r.qkey.ok_or_else(|| {
                        ApiError::bad("bad_attr", "a UD QP's INIT needs its qkey")
                    })?);
                    attr.path_mtu = Some(self.ud_mtu(port));
                }
                QpState::Rts => attr.sq_psn = Some(self.local_psn(qpn, r.local_psn)?),
                _ => {}
            }
        } else {
            self.rc_attr(qpn, state, r, &mut attr, &mut port)?;
        }
        self.ask(l, move |h, _| h.dev.modify(qpn, &attr, port))?
            .map_err(|e| ApiError::conflict("bad_state", e.to_string()))
    }

    /// An RC QP's attributes for the transition to `state` (see [`Rdma::modify_qp`]).
    fn rc_attr(
        &self,
        qpn: u32,
        state: QpState,
        r: &ConnectRequest,
        attr: &mut QpAttr,
        port: &mut usize,
    ) -> Result<(), ApiError> {
        match state {
            QpState::Init => {
                attr.access = Some(r.access);
                attr.pkey_index = Some(0);
            }
            QpState::Rtr => {
                let (path, p) = self.path_for(qpn, r)?;
                *port = p;
                attr.path = Some(path);
                attr.path_mtu = Some(r.mtu);
                attr.dest_qp = Some(r.remote_qpn);
                attr.rq_psn = Some(remote_psn(r)?);
                attr.min_rnr_timer = Some(r.min_rnr_timer);
                attr.max_dest_rd_atomic = Some(r.max_rd_atomic);
            }
            QpState::Rts => {
                attr.sq_psn = Some(self.local_psn(qpn, r.local_psn)?);
                attr.timeout = Some(r.timeout);
                attr.retry_cnt = Some(r.retry_cnt);
                attr.rnr_retry = Some(r.rnr_retry);
                attr.max_rd_atomic = Some(r.max_rd_atomic);
            }
            _ => {}
        }
        Ok(())
    }

    /// Posts a send work request.
    pub fn post_send(&self, qpn: u32, wr: SendWr) -> Result<(), ApiError> {
        let l = self.lcore_of(qpn)?;
        self.ask(l, move |h, now| h.dev.post_send(qpn, wr, now))?
            .map_err(|e| ApiError::conflict("post_refused", e.to_string()))
    }

    /// Posts a receive work request.
    pub fn post_recv(&self, qpn: u32, wr: RecvWr) -> Result<(), ApiError> {
        let l = self.lcore_of(qpn)?;
        self.ask(l, move |h, _| h.dev.post_recv(qpn, wr))?
            .map_err(|e| ApiError::conflict("post_refused", e.to_string()))
    }

    /// Takes up to `max` completions of each kind from a QP's own CQs, waiting up to `wait`
    /// for the first; refused for a QP whose completions go to a created CQ.
    pub fn poll_cq(
        &self,
        qpn: u32,
        max: usize,
        wait: Duration,
    ) -> Result<(Vec<WorkCompletion>, Vec<WorkCompletion>), ApiError> {
        let meta = self
            .qps
            .lock()
            .expect("qp table")
            .get(&qpn)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("no QP {qpn}")))?;
        if let Some(c) = meta.cqs.iter().flatten().next() {
            return Err(ApiError::conflict(
                "cq_bound",
                format!("QP {qpn}'s completions go to CQ {c}: poll /v1/cqs/{c}/completions"),
            ));
        }
        let l = meta.lcore;
        let deadline = Instant::now() + wait;
        loop {
            let (s, r) = self.ask(l, move |h, _| h.dev.poll_cq(qpn, max))?;
            if !s.is_empty() || !r.is_empty() || Instant::now() >= deadline {
                return Ok((s, r));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Posts `count` copies of `wr` on the QP's lcore, `depth` outstanding; waits for them.
    pub fn stream(
        &self,
        qpn: u32,
        wr: SendWr,
        count: u64,
        depth: usize,
        duration: Option<Duration>,
        wait: Duration,
    ) -> Result<StreamResult, ApiError> {
        let codes = ("stream_refused", "stream_ended");
        self.run_test(qpn, "stream", codes, wait, move |h, now, reply| {
            let shape = (count, depth, duration);
            h.tests.stream(&mut h.dev, now, qpn, wr, shape, reply)
        })
    }

    /// Receives `count` messages on the QP's lcore, `posted` receives of `recv` already
    /// there, or counts arrivals for `duration` (see `Tests::recv_stream`); waits up
    /// to `wait`.
    pub fn recv_stream(
        &self,
        qpn: u32,
        recv: RecvWr,
        count: u64,
        posted: u64,
        duration: Option<Duration>,
        wait: Duration,
    ) -> Result<StreamResult, ApiError> {
        let codes = ("stream_refused", "stream_ended");
        self.run_test(qpn, "receive stream", codes, wait, move |h, now, reply| {
            let shape = (count, posted, duration);
            h.tests
                .recv_stream(&mut h.dev, now, qpn, recv, shape, reply)
        })
    }

    /// Receive streams on several QPs of one lcore at once (see `Tests::recv_streams`).
    pub fn recv_streams(
        &self,
        qpns: Vec<u32>,
        recv: RecvWr,
        count: u64,
        posted: u64,
        duration: Option<Duration>,
        wait: Duration,
    ) -> Result<StreamResult, ApiError> {
        let first = self.one_lcore(qpns.iter().copied(), "receive stream")?;
        let codes = ("stream_refused", "stream_ended");
        self.run_test(
            first,
            "receive stream",
            codes,
            wait,
            move |h, now, reply| {
                let shape = (count, posted, duration);
                h.tests
                    .recv_streams(&mut h.dev, now, qpns, recv, shape, reply)
            },
        )
    }

    /// Runs one of perftest's latency tests on the QP's lcore (see `Tests::latency`):
    /// `iters` iterations or, with a `duration`, that long; waits up to `wait` for it.
    #[allow(clippy::too_many_arguments)]
    pub fn latency_test(
        &self,
        qpn: u32,
        kind: LatKind,
        wr: SendWr,
        iters: u64,
        duration: Option<Duration>,
        server: bool,
        wait: Duration,
    ) -> Result<LatResult, ApiError> {
        let codes = ("test_refused", "test_ended");
        self.run_test(qpn, "latency test", codes, wait, move |h, now, reply| {
            let test = (kind, wr, server);
            h.tests
                .latency(&mut h.dev, now, qpn, test, iters, duration, reply)
        })
    }

    /// Hands a test (`make` builds its command around the reply channel) to the QP's lcore
    /// and waits up to `wait` for its result; `what` names it in errors, `codes` are the
    /// error codes for a refused test and for one whose QP went away.
    fn run_test<T: Send + 'static>(
        &self,
        qpn: u32,
        what: &str,
        codes: (&'static str, &'static str),
        wait: Duration,
        f: impl FnOnce(&mut Shard, dataplane::Instant, Reply<T>) + Send + 'static,
    ) -> Result<T, ApiError> {
        let l = self.lcore_of(qpn)?;
        let (tx, rx) = bounded(1);
        self.lcores[l]
            .send(Command::Handler(ApplianceCommand::Rdma(RdmaCommand::test(
                tx, f,
            ))))
            .map_err(|_| ApiError::internal("lcore_unavailable", "the lcore has stopped"))?;
        match rx.recv_timeout(wait) {
            Ok(r) => r.map_err(|e| ApiError::conflict(codes.0, e.to_string())),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(ApiError::internal(
                "timeout",
                format!("the {what} did not finish in {wait:?}"),
            )),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(ApiError::conflict(
                codes.1,
                format!("the QP was destroyed (or the node stopped) before the {what} finished"),
            )),
        }
    }

    /// Every lcore's RDMA counters.
    /// Completion latency by opcode, every lcore's histograms added together.
    pub fn latency(&self) -> Result<LatencyHistograms, ApiError> {
        let mut all = LatencyHistograms::default();
        for l in 0..self.lcores.len() {
            all.add(&self.ask(l, |h, _| h.dev.latencies())?);
        }
        Ok(all)
    }

    pub fn counters(&self) -> Result<Vec<HostCounters>, ApiError> {
        (0..self.lcores.len())
            .map(|l| self.ask(l, |h, now| h.counters(now)))
            .collect()
    }

    /// Ends every running stream and latency test on every lcore (the node is stopping):
    /// their QPs go to ERR and each test answers its caller at once. How many QPs stopped.
    pub fn cancel_tests(&self) -> Result<usize, ApiError> {
        (0..self.lcores.len())
            .map(|l| self.ask(l, |h, now| h.tests.cancel(&mut h.dev, now)))
            .sum()
    }

    /// The DCQCN line rate QPs start at.
    pub fn line_bps(&self) -> f64 {
        self.line_bps
    }
}

/// An lcore's RDMA counters as JSON: the QP counters under their rxe/mlx5 names, summed, and
/// the handoffs.
pub fn host_counters_json(h: &HostCounters) -> serde_json::Map<String, serde_json::Value> {
    let mut m: serde_json::Map<String, serde_json::Value> =
        h.qp.named()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into()))
            .collect();
    m.insert("handoffs".into(), h.handoffs.into());
    m.insert("handoff_drops".into(), h.handoff_drops.into());
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
