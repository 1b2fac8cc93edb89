//! Running a node: EAL, mempool and ports up; one worker per lcore; the control loop on the
//! main lcore; and an orderly stop that returns every mbuf and leaves no DPDK files behind.

use crate::config::{MemifRole, Mode, Plan, PortPlan};
use crate::rdma::Rdma;
use crate::state::ApiState;
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use dataplane::appliance::{Appliance, ApplianceCommand};
use dataplane::counters::LcoreCounters;
use dataplane::dpdk::{
    self, DpdkPort, DpdkQueue, Eal, HugepageHeap, Mempool, PortSetup, TscSource,
};
use dataplane::host::RdmaHost;
use dataplane::lcore::{Command, Handler, LcoreId, MacSwap, Worker};
use dataplane::net::neighbor::State;
use dataplane::net::{NetCommand, NetEvent, NetStack};
use dataplane::port::impair::{ImpairHandle, Impaired};
use dataplane::port::{PortId, PortQueue, QueueId};
use serde_json::json;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a run lasts and what the control loop does besides serving.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Stop by itself after this long.
    pub duration: Option<Duration>,
    /// Addresses to ping from the appliance.
    pub ping: Vec<IpAddr>,
    /// Echo requests per address.
    pub ping_count: u16,
    /// Time between echo requests.
    pub ping_interval: Duration,
    /// Write the final report as JSON here.
    pub report: Option<PathBuf>,
}

/// Why a node could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// DPDK refused something.
    #[error(transparent)]
    Dpdk(#[from] dpdk::Error),
    /// A port named in the config did not come up.
    #[error("config field `ports[{index}].device`: {source}")]
    Port {
        /// Port index.
        index: usize,
        /// The DPDK error.
        source: dpdk::Error,
    },
}

/// The queues an appliance lcore runs on: DPDK queues behind an impairment stage (off unless
/// set through the API).
pub type NodeQueue = Impaired<DpdkQueue, TscSource>;

/// Lets the control loop talk to any handler: the appliance takes [`NetCommand`]s, the
/// benchmark handler none.
pub trait ControlledHandler<Q: PortQueue>: Handler<Q> + 'static {
    /// Wraps a stack command for this handler, if it takes them.
    fn net_command(cmd: NetCommand) -> Option<Self::Command>;
}

impl ControlledHandler<NodeQueue> for Appliance<dpdk::Mbuf> {
    fn net_command(cmd: NetCommand) -> Option<ApplianceCommand> {
        Some(ApplianceCommand::Net(cmd))
    }
}

impl ControlledHandler<DpdkQueue> for MacSwap {
    fn net_command(_: NetCommand) -> Option<()> {
        None
    }
}

#[derive(Default, Debug)]
struct PingStats {
    sent: u32,
    received: u32,
    rtts_us: Vec<f64>,
}

/// Runs a node until `stop` is set (by a signal) or the duration passes. Returns the final
/// report (also written to `opts.report`).
pub fn run(
    plan: &Plan,
    opts: &RunOptions,
    stop: Arc<AtomicBool>,
) -> Result<serde_json::Value, RunError> {
    let eal = Eal::init(&plan.eal)?;
    let max_mtu = plan.ports.iter().map(|p| p.mtu).max().unwrap_or(1500);
    // Room for the largest frame (MTU + Ethernet + VLAN), rounded up, at least DPDK's default.
    let data_room = ((max_mtu as u32 + 22).div_ceil(128) * 128).max(2048) as u16;
    let pool = Arc::new(Mempool::new(
        "ferroce_mbufs",
        plan.mbufs,
        256,
        data_room,
        dataplane::dpdk::SOCKET_ID_ANY,
    )?);
    let nworkers = plan.eal.worker_cpus.len() as u16;
    let mut ports = Vec::new();
    // Ports that did not start: memif clients whose server is not there yet.
    let mut stopped = Vec::new();
    for (i, p) in plan.ports.iter().enumerate() {
        let setup = PortSetup {
            device: p.device_name.clone(),
            index: PortId(i as u16),
            queues: nworkers,
            mtu: p.mtu,
            rx_desc: plan.descriptors,
            tx_desc: plan.descriptors,
        };
        let port = if p.memif == Some(MemifRole::Client) {
            let (port, started) = DpdkPort::start_or_stopped(&setup, pool.clone())
                .map_err(|source| RunError::Port { index: i, source })?;
            if let Err(e) = &started {
                tracing::warn!(
                    port = i,
                    device = %p.device_name,
                    "memif server not there yet: connecting when it is ({e})"
                );
            }
            stopped.push(started.is_err());
            port
        } else {
            stopped.push(false);
            DpdkPort::start(&setup, pool.clone())
                .map_err(|source| RunError::Port { index: i, source })?
        };
        let info = port.info();
        tracing::info!(
            port = i,
            device = %p.device_name,
            driver = port.driver(),
            mac = %info.mac,
            mtu = info.mtu,
            tx_ipv4_cksum_offload = info.caps.tx_ipv4_cksum,
            rx_ipv4_cksum_offload = info.caps.rx_ipv4_cksum,
            tx_multi_seg = info.caps.tx_multi_seg,
            rss = info.caps.rss,
            rss_steering = info.caps.rss_steering,
            "port started"
        );
        ports.push(port);
    }
    let clock = TscSource::new(&eal);
    let nworkers = nworkers as usize;
    let clients: Vec<(bool, bool)> = plan
        .ports
        .iter()
        .zip(&stopped)
        .map(|(p, s)| (p.memif == Some(MemifRole::Client), *s))
        .collect();
    let report = match plan.mode {
        Mode::Stack => {
            let (ev_tx, ev_rx) = bounded(4096);
            let macs: Vec<_> = ports.iter().map(|p| p.info().mac).collect();
            let net = plan.net.clone();
            // Per lcore, its queue of every port behind an impairment stage; per port, the
            // stages' handles.
            let mut impair: Vec<Vec<ImpairHandle>> = ports.iter().map(|_| Vec::new()).collect();
            let mut queues: Vec<Vec<NodeQueue>> = Vec::new();
            for l in 0..nworkers {
                let mut qs = Vec::new();
                for (pi, p) in ports.iter().enumerate() {
                    let seed = 0x5eed_0000 ^ (pi as u64) << 8 ^ l as u64;
                    let (q, h) = Impaired::new(p.queue(QueueId(l as u16)), clock, seed);
                    qs.push(q);
                    impair[pi].push(h);
                }
                queues.push(qs);
            }
            let speed = ports
                .first()
                .map(|p| p.link().speed_mbps)
                .filter(|s| *s > 0)
                .unwrap_or(100_000);
            let line_bps = speed as f64 * 1e6;
            let mut hosts = RdmaHost::sharded(nworkers, 0, line_bps);
            // QP1's CM names its CA by port 0's node GUID, as rxe does.
            if let Some(mac) = macs.first() {
                let guid = dataplane::transport::cm::ca_guid_of(mac.0);
                for h in hosts.iter_mut() {
                    if let Some(g) = h.shard().gsi.as_mut() {
                        g.cm.set_local_ca_guid(guid);
                    }
                }
            }
            let mut hosts = hosts.into_iter();
            let heap = HugepageHeap::new(&eal);
            let api_net = plan.net.clone();
            let api_macs = macs.clone();
            let api_mtus: Vec<u16> = ports.iter().map(|p| p.info().mtu).collect();
            let api_addr = plan.api;
            let api_token = plan.api_token.clone();
            run_workers(
                &ports,
                queues,
                clock,
                opts,
                stop,
                Some(ev_rx),
                move |_| {
                    Appliance::new(
                        NetStack::new(&net, &macs, Some(ev_tx.clone())),
                        hosts.next().expect("one host per lcore"),
                    )
                },
                move |cmds, counters| {
                    let rdma = Rdma::new(
                        cmds.to_vec(),
                        Box::new(move |len| heap.alloc(len).map_err(|e| e.to_string())),
                        &api_net,
                        api_macs,
                        line_bps,
                    )
                    .with_port_mtus(api_mtus);
                    let nports = impair.len();
                    let state = Arc::new(ApiState {
                        rdma,
                        ports: std::sync::Mutex::new(Vec::new()),
                        impair,
                        lcore_counters: counters.to_vec(),
                        token: api_token.clone(),
                        apps: Default::default(),
                        mbufs: Default::default(),
                        impair_cfg: std::sync::Mutex::new(vec![
                            [
                                serde_json::Value::Null,
                                serde_json::Value::Null
                            ];
                            nports
                        ]),
                    });
                    Some((state, api_addr))
                },
                plan.idle_sleep,
                &clients,
                plan.attach.as_ref(),
            )
        }
        Mode::Macswap => {
            let queues = (0..nworkers)
                .map(|l| ports.iter().map(|p| p.queue(QueueId(l as u16))).collect())
                .collect();
            run_workers(
                &ports,
                queues,
                clock,
                opts,
                stop,
                None,
                |_| MacSwap,
                |_, _| None,
                plan.idle_sleep,
                &clients,
                None,
            )
        }
    }?;
    let port_stats = ports_json(&ports);
    settle_memif_links(&ports, &plan.ports);
    drop(ports); // stop and close: the drivers return the mbufs in their rings
    let leaked = pool.in_use();
    if leaked != 0 {
        tracing::error!(mbufs = leaked, "mbufs still in use after stop");
    }
    drop(pool);
    drop(eal);
    let mut report = report;
    report["ports"] = json!(port_stats);
    report["mbufs_in_use_at_exit"] = json!(leaked);
    if let Some(path) = &opts.report
        && let Err(e) = std::fs::write(path, serde_json::to_vec_pretty(&report).unwrap_or_default())
    {
        tracing::error!("writing report {}: {e}", path.display());
    }
    Ok(report)
}

/// Asks every worker to stop making burst calls ([`Command::Detach`]) and waits for each
/// answer (a second at most per worker: a worker that does not answer has stopped).
fn detach_all<C>(cmds: &[Sender<Command<C>>]) {
    let answers: Vec<_> = cmds
        .iter()
        .filter_map(|c| {
            let (tx, rx) = bounded(1);
            c.send(Command::Detach(tx)).ok().map(|_| rx)
        })
        .collect();
    for rx in answers {
        let _ = rx.recv_timeout(Duration::from_secs(1));
    }
}

/// Asks every worker to stop making burst calls on `port` ([`Command::DetachPort`]) and waits
/// for each answer, as [`detach_all`] does.
fn detach_port<C>(cmds: &[Sender<Command<C>>], port: usize) {
    let answers: Vec<_> = cmds
        .iter()
        .filter_map(|c| {
            let (tx, rx) = bounded(1);
            c.send(Command::DetachPort(port, tx)).ok().map(|_| rx)
        })
        .collect();
    for rx in answers {
        let _ = rx.recv_timeout(Duration::from_secs(1));
    }
}

/// A memif client port's link down this long is connected again ([`Reconnect`]).
const MEMIF_RECONNECT_AFTER: Duration = Duration::from_secs(1);
/// The first wait between two attempts to connect again; it doubles up to
/// [`MEMIF_RECONNECT_MAX`].
const MEMIF_RECONNECT_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between two attempts.
const MEMIF_RECONNECT_MAX: Duration = Duration::from_secs(4);
/// How long a port that started is left to finish the driver's handshake (in its interrupt
/// thread) before it is stopped and started again: stopping it mid-handshake would race that
/// thread, and a loaded machine can take far longer than the usual milliseconds.
const MEMIF_HANDSHAKE_WAIT: Duration = Duration::from_secs(5);

/// Connects a memif client port again once its server has gone (killed, restarted). DPDK
/// 22.11's memif client connects only when its port starts, so a client whose link has been
/// down for [`MEMIF_RECONNECT_AFTER`] is detached from the workers, stopped and started
/// again (every [`MEMIF_RECONNECT_FIRST`], doubling to [`MEMIF_RECONNECT_MAX`], while its
/// server is not there), and given back to the workers once it started. The link comes up
/// when the driver's handshake is done; the control loop then tells the stacks
/// ([`NetCommand::LinkUp`]), which resolve their neighbours again.
#[derive(Debug)]
struct Reconnect {
    down_since: Option<Instant>,
    next_try: Instant,
    wait: Duration,
    /// The workers have been told to leave the port alone (it is stopped).
    detached: bool,
    /// Failed attempts since the link went down.
    failures: u32,
}

impl Reconnect {
    /// A client port at `now`; `stopped` if it did not start (its workers start detached
    /// from it, and it is tried again at once).
    fn new(now: Instant, stopped: bool) -> Self {
        Reconnect {
            down_since: stopped.then(|| now.checked_sub(MEMIF_RECONNECT_AFTER).unwrap_or(now)),
            // A port that started has its handshake to finish first.
            next_try: if stopped {
                now
            } else {
                now + MEMIF_HANDSHAKE_WAIT
            },
            wait: MEMIF_RECONNECT_FIRST,
            detached: stopped,
            failures: stopped as u32,
        }
    }

    /// One look at port `i` (link `up`), from the control loop.
    fn poll<C>(
        &mut self,
        i: usize,
        port: &DpdkPort,
        up: bool,
        now: Instant,
        cmds: &[Sender<Command<C>>],
    ) {
        if up {
            if self.failures > 0 || self.down_since.is_some() {
                *self = Reconnect::new(now, false);
            }
            return;
        }
        let since = *self.down_since.get_or_insert(now);
        if now.duration_since(since) < MEMIF_RECONNECT_AFTER || now < self.next_try {
            return;
        }
        if !self.detached {
            detach_port(cmds, i);
            self.detached = true;
        }
        match port.restart() {
            Ok(()) => {
                for c in cmds {
                    let _ = c.send(Command::AttachPort(i));
                }
                self.detached = false;
                tracing::info!(
                    port = i,
                    device = port.name(),
                    "memif client connecting again"
                );
                self.next_try = now + MEMIF_HANDSHAKE_WAIT.max(self.wait);
                return;
            }
            Err(e) => {
                self.failures += 1;
                if self.failures == 1 {
                    tracing::warn!(
                        port = i,
                        device = port.name(),
                        "memif server gone: connecting again every {} s at most ({e})",
                        MEMIF_RECONNECT_MAX.as_secs()
                    );
                } else {
                    tracing::debug!(port = i, "memif server still not there: {e}");
                }
            }
        }
        self.next_try = now + self.wait;
        self.wait = (self.wait * 2).min(MEMIF_RECONNECT_MAX);
    }
}

/// How long a stopping memif client waits, its lcores detached, before it closes its ports
/// (see [`settle_memif_links`]).
const MEMIF_CLIENT_GRACE: Duration = Duration::from_millis(200);
/// How long a stopping memif server waits for its client to close first.
const MEMIF_SERVER_WAIT: Duration = Duration::from_millis(1000);

/// Orders the close of memif ports between two nodes stopped together. DPDK 22.11's memif
/// driver is not safe against a disconnect while the node is busy with the port: the
/// interrupt thread unmaps the shared rings under an lcore inside a burst call (1 stop in 100
/// of two nodes stopped together crashed one of them on this 2-CPU machine), and a node's own
/// close racing the peer's disconnect in the interrupt thread crashed in the EAL heap. So the
/// lcores detach first (every node), then the client closes after [`MEMIF_CLIENT_GRACE`] (time
/// for the server to detach too), and the server closes only once its link is down, that is,
/// once the interrupt thread has taken the client's disconnect, or after [`MEMIF_SERVER_WAIT`].
/// A peer that keeps running meets the driver's race at our close, as at any disconnect.
fn settle_memif_links(ports: &[DpdkPort], plans: &[PortPlan]) {
    let client_up = ports
        .iter()
        .zip(plans)
        .any(|(d, p)| p.memif == Some(MemifRole::Client) && d.link().up);
    if client_up {
        std::thread::sleep(MEMIF_CLIENT_GRACE);
    }
    let servers: Vec<&DpdkPort> = ports
        .iter()
        .zip(plans)
        .filter(|(_, p)| p.memif == Some(MemifRole::Server))
        .map(|(d, _)| d)
        .collect();
    if servers.is_empty() {
        return;
    }
    let deadline = Instant::now() + MEMIF_SERVER_WAIT;
    while Instant::now() < deadline {
        if servers.iter().all(|p| !p.link().up) {
            // The link goes down as the driver's disconnect starts: let it finish.
            std::thread::sleep(Duration::from_millis(20));
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What a mode's `serve` hook gives the control loop: the API's state and where to serve it.
type Serve = Option<(Arc<ApiState>, Option<std::net::SocketAddr>)>;

#[allow(clippy::too_many_arguments)]
fn run_workers<Q, H>(
    ports: &[DpdkPort],
    queues: Vec<Vec<Q>>,
    clock: TscSource,
    opts: &RunOptions,
    stop: Arc<AtomicBool>,
    events: Option<Receiver<NetEvent>>,
    mut make: impl FnMut(usize) -> H,
    serve: impl FnOnce(&[Sender<Command<H::Command>>], &[Arc<LcoreCounters>]) -> Serve,
    idle_sleep: Option<Duration>,
    memif_clients: &[(bool, bool)],
    attach: Option<&crate::config::AttachPlan>,
) -> Result<serde_json::Value, RunError>
where
    Q: PortQueue + Send + 'static,
    H: ControlledHandler<Q>,
    H::Command: std::fmt::Debug,
{
    let mut cmds: Vec<Sender<Command<H::Command>>> = Vec::new();
    let mut counters: Vec<Arc<LcoreCounters>> = Vec::new();
    let mut launch_err = None;
    // memif clients that did not start are left alone until they do.
    let off = memif_clients
        .iter()
        .enumerate()
        .filter(|(_, (_, stopped))| *stopped)
        .fold(0u64, |m, (i, _)| m | 1 << i);
    for (i, qs) in queues.into_iter().enumerate() {
        let (tx, rx) = unbounded();
        let c = Arc::new(LcoreCounters::default());
        let w = Worker::new(LcoreId(i as u16), qs, make(i), clock, c.clone(), rx)
            .with_idle_sleep(idle_sleep)
            .with_ports_detached(off);
        if let Err(e) = dpdk::launch(i as u32 + 1, move || drop(w.run())) {
            launch_err = Some(e);
            break;
        }
        cmds.push(tx);
        counters.push(c);
    }
    tracing::info!(workers = cmds.len(), "lcores running");
    let api = if launch_err.is_none() {
        serve(&cmds, &counters)
    } else {
        None
    };
    let mut server = None;
    if let Some((state, Some(addr))) = &api {
        match start_api(*addr, state.clone()) {
            Ok(s) => {
                tracing::info!(%addr, "REST API listening (http://{addr}/v1/health)");
                if !addr.ip().is_loopback() && state.token.is_none() {
                    tracing::warn!(
                        %addr,
                        "the REST API listens beyond loopback without a token: anyone who \
                         reaches {addr} can manage this node (set [api] token)"
                    );
                }
                server = Some(s);
            }
            Err(e) => {
                tracing::error!(%addr, "REST API cannot listen: {e}");
                stop.store(true, Ordering::Relaxed);
            }
        }
    }
    let api = api.map(|(s, _)| s);
    // Applications attach beside the API, to the same node state.
    let mut attach_server = None;
    if let (Some(state), Some(plan)) = (&api, attach) {
        match crate::attach::AttachServer::start(state.clone(), &plan.path, plan.mode, plan.group) {
            Ok(s) => {
                tracing::info!(socket = %plan.path.display(), "applications attach at {}", plan.path.display());
                attach_server = Some(s);
            }
            Err(e) => tracing::error!(socket = %plan.path.display(), "attach socket: {e}"),
        }
    }
    let mut next_ports_refresh = Instant::now();
    let started = Instant::now();
    let mut links: Vec<bool> = vec![false; ports.len()];
    let mut reconnect: Vec<Option<Reconnect>> = memif_clients
        .iter()
        .map(|&(client, stopped)| client.then(|| Reconnect::new(started, stopped)))
        .collect();
    let mut pings: Vec<PingStats> = opts.ping.iter().map(|_| PingStats::default()).collect();
    let mut next_ping = started;
    let mut seq: u16 = 0;
    let ident = (std::process::id() & 0xffff) as u16;
    while launch_err.is_none() && !stop.load(Ordering::Relaxed) {
        if opts.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if let Some(a) = &api
            && Instant::now() >= next_ports_refresh
        {
            next_ports_refresh = Instant::now() + Duration::from_millis(250);
            *a.ports.lock().expect("ports") = ports_json(ports);
            if let Some(p) = ports.first() {
                a.mbufs[0].store(p.pool().in_use() as u64, Ordering::Relaxed);
                a.mbufs[1].store(p.pool().size() as u64, Ordering::Relaxed);
            }
        }
        for (i, p) in ports.iter().enumerate() {
            let up = p.link().up;
            if let Some(r) = reconnect.get_mut(i).and_then(|r| r.as_mut()) {
                r.poll(i, p, up, Instant::now(), &cmds);
            }
            if up != links[i] {
                links[i] = up;
                // Seen at once by the API and by attached applications (their port events).
                if let Some(a) = &api {
                    *a.ports.lock().expect("ports") = ports_json(ports);
                }
                tracing::info!(
                    port = i,
                    device = p.name(),
                    up,
                    "link {}",
                    if up { "up" } else { "down" }
                );
                if up {
                    for c in &cmds {
                        if let Some(cmd) = H::net_command(NetCommand::LinkUp { port: i }) {
                            let _ = c.send(Command::Handler(cmd));
                        }
                    }
                }
            }
        }
        // Ping once every link is up (a memif side that sends before its peer connects sends
        // nothing).
        let all_up = links.iter().all(|u| *u);
        if all_up && !opts.ping.is_empty() && seq < opts.ping_count && Instant::now() >= next_ping {
            for (k, dst) in opts.ping.iter().enumerate() {
                let cmd = NetCommand::Ping {
                    dst: *dst,
                    ident,
                    seq,
                    size: 56,
                };
                if let Some(c) = H::net_command(cmd)
                    && cmds[0].send(Command::Handler(c)).is_ok()
                {
                    pings[k].sent += 1;
                }
            }
            seq += 1;
            next_ping = Instant::now() + opts.ping_interval;
        }
        if let Some(ev) = &events {
            while let Ok(e) = ev.recv_timeout(Duration::from_millis(20)) {
                if let (Some(a), NetEvent::Resolved { port, ip, mac }) = (&api, &e) {
                    a.rdma.neighbor_resolved(*port, *ip, *mac);
                }
                handle_event::<Q, H>(e, &cmds, &opts.ping, &mut pings, ident);
            }
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Attached applications go first: their sessions destroy what they made while the lcores
    // still answer.
    if let Some(s) = attach_server {
        s.stop();
    }
    // The API stops first, so nothing is asked of lcores that are stopping. Its graceful
    // stop waits for the requests under way: running tests end now (their QPs to ERR, their
    // callers answered), again until it has stopped, for one that began meanwhile; a -D 60
    // stream would otherwise hold the stop for a minute.
    if let Some((tx, thread)) = server {
        let _ = tx.send(());
        while !thread.is_finished() {
            if let Some(a) = &api {
                match a.rdma.cancel_tests() {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(qps = n, "stopping: tests cancelled, their QPs in ERR"),
                    Err(e) => tracing::warn!("stopping: cancelling tests: {}", e.message),
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = thread.join();
    }
    // Then the lcores leave the ports alone (they still answer the questions below), so a
    // peer that disconnects from here on cannot pull a memif ring out from under a burst.
    detach_all(&cmds);
    let rdma_json: Vec<serde_json::Value> = api
        .as_ref()
        .and_then(|a| a.rdma.counters().ok())
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, h)| json!({"lcore": i, "counters": crate::rdma::host_counters_json(h)}))
        .collect();
    drop(api);
    // Ask for the neighbour tables before stopping.
    let mut neighbors = Vec::new();
    for (i, c) in cmds.iter().enumerate() {
        let (tx, rx) = bounded(1);
        if let Some(cmd) = H::net_command(NetCommand::Neighbors(tx))
            && c.send(Command::Handler(cmd)).is_ok()
            && let Ok(v) = rx.recv_timeout(Duration::from_secs(1))
        {
            for (port, ip, state) in v {
                let (st, mac) = match state {
                    State::Reachable { mac, .. } => ("reachable", Some(mac.to_string())),
                    State::Probe { mac, .. } => ("probe", Some(mac.to_string())),
                    State::Incomplete { .. } => ("incomplete", None),
                };
                neighbors.push(json!({"lcore": i, "port": port, "ip": ip.to_string(), "state": st, "mac": mac}));
            }
        }
    }
    for c in &cmds {
        let _ = c.send(Command::Stop);
    }
    dpdk::wait_all();
    if let Some(ev) = &events {
        while let Ok(e) = ev.try_recv() {
            handle_event::<Q, H>(e, &[], &opts.ping, &mut pings, ident);
        }
    }
    if let Some(e) = launch_err {
        return Err(e.into());
    }
    let lcores_json: Vec<_> = counters
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let m: serde_json::Map<String, serde_json::Value> = c
                .snapshot()
                .into_iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            json!({"lcore": i, "counters": m})
        })
        .collect();
    let pings_json: Vec<_> = opts
        .ping
        .iter()
        .zip(&pings)
        .map(|(dst, p)| {
            let (min, max) = p.rtts_us.iter().fold((f64::MAX, 0f64), |(a, b), r| (a.min(*r), b.max(*r)));
            let avg = if p.rtts_us.is_empty() { 0.0 } else { p.rtts_us.iter().sum::<f64>() / p.rtts_us.len() as f64 };
            json!({"dst": dst.to_string(), "sent": p.sent, "received": p.received,
                   "rtt_min_us": if p.rtts_us.is_empty() { 0.0 } else { min }, "rtt_avg_us": avg, "rtt_max_us": max})
        })
        .collect();
    Ok(
        json!({"lcores": lcores_json, "rdma": rdma_json, "neighbors": neighbors, "pings": pings_json,
              "uptime_s": started.elapsed().as_secs_f64()}),
    )
}

fn handle_event<Q: PortQueue, H: ControlledHandler<Q>>(
    e: NetEvent,
    cmds: &[Sender<Command<H::Command>>],
    targets: &[IpAddr],
    pings: &mut [PingStats],
    ident: u16,
) {
    match e {
        NetEvent::Resolved { port, ip, mac } => {
            tracing::info!(port, %ip, %mac, "neighbor resolved");
            // Every lcore gets what one learnt (the one that learnt it just refreshes).
            for c in cmds {
                if let Some(cmd) = H::net_command(NetCommand::Neighbor { port, ip, mac }) {
                    let _ = c.send(Command::Handler(cmd));
                }
            }
        }
        NetEvent::EchoReply {
            from,
            ident: id,
            seq,
            rtt,
        } if id == ident => {
            if let Some(k) = targets.iter().position(|t| *t == from) {
                pings[k].received += 1;
                pings[k].rtts_us.push(rtt.as_nanos() as f64 / 1000.0);
            }
            tracing::info!(%from, seq, rtt_us = rtt.as_nanos() as f64 / 1000.0, "echo reply");
        }
        NetEvent::EchoReply { .. } => {}
        NetEvent::PingFailed { dst, reason } => {
            tracing::warn!(%dst, reason = reason.label(), "ping not sent")
        }
    }
}

/// Ports as the report and the API show them: device, driver, MAC, link, counters.
fn ports_json(ports: &[DpdkPort]) -> Vec<serde_json::Value> {
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = p.stats();
            let l = p.link();
            // The driver's extended statistics, the non-zero ones.
            let xstats: serde_json::Map<String, serde_json::Value> =
                p.xstats().into_iter().filter(|(_, v)| *v != 0).map(|(k, v)| (k, json!(v))).collect();
            json!({"port": i, "device": p.name(), "driver": p.driver(), "mac": p.info().mac.to_string(),
                   "mtu": p.info().mtu, "link_up": l.up, "speed_mbps": l.speed_mbps,
                   "ipackets": s.ipackets, "opackets": s.opackets, "ibytes": s.ibytes, "obytes": s.obytes,
                   "imissed": s.imissed, "ierrors": s.ierrors, "oerrors": s.oerrors, "rx_nombuf": s.rx_nombuf,
                   "xstats": xstats})
        })
        .collect()
}

/// Starts the REST API on a thread of its own; the sender stops it.
fn start_api(
    addr: std::net::SocketAddr,
    state: Arc<ApiState>,
) -> std::io::Result<(
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(64)
        .thread_name("roced-api")
        .enable_all()
        .build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind(addr))?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("roced-api".into())
        .spawn(move || {
            let r = rt.block_on(crate::api::serve(listener, state, async {
                let _ = rx.await;
            }));
            if let Err(e) = r {
                tracing::error!("REST API stopped: {e}");
            }
            rt.shutdown_timeout(Duration::from_secs(2));
        })?;
    Ok((tx, thread))
}
