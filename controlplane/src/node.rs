//! Running a node: EAL, mempool and ports up; one worker per lcore; the control loop on the
//! main lcore; and an orderly stop that returns every mbuf and leaves no DPDK files behind.

use crate::config::{Mode, Plan};
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use dataplane::counters::LcoreCounters;
use dataplane::dpdk::{self, DpdkPort, DpdkQueue, Eal, Mempool, PortSetup, TscSource};
use dataplane::lcore::{Command, Handler, LcoreId, MacSwap, Worker};
use dataplane::net::neighbor::State;
use dataplane::net::{NetCommand, NetEvent, NetStack};
use dataplane::port::{PortId, QueueId};
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

/// Lets the control loop talk to any handler: the IP stack takes [`NetCommand`]s, the
/// benchmark handler none.
pub trait ControlledHandler: Handler<DpdkQueue> + 'static {
    /// Wraps a stack command for this handler, if it takes them.
    fn net_command(cmd: NetCommand) -> Option<Self::Command>;
}

impl ControlledHandler for NetStack<dpdk::Mbuf> {
    fn net_command(cmd: NetCommand) -> Option<NetCommand> {
        Some(cmd)
    }
}

impl ControlledHandler for MacSwap {
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
        dpdk_sys::SOCKET_ID_ANY,
    )?);
    let nworkers = plan.eal.worker_cpus.len() as u16;
    let mut ports = Vec::new();
    for (i, p) in plan.ports.iter().enumerate() {
        let setup = PortSetup {
            device: p.device_name.clone(),
            index: PortId(i as u16),
            queues: nworkers,
            mtu: p.mtu,
            rx_desc: plan.descriptors,
            tx_desc: plan.descriptors,
        };
        let port = DpdkPort::start(&setup, pool.clone())
            .map_err(|source| RunError::Port { index: i, source })?;
        let info = port.info();
        tracing::info!(
            port = i,
            device = %p.device_name,
            driver = port.driver(),
            mac = %info.mac,
            mtu = info.mtu,
            tx_ipv4_cksum_offload = info.caps.tx_ipv4_cksum,
            rx_ipv4_cksum_offload = info.caps.rx_ipv4_cksum,
            rss = info.caps.rss,
            "port started"
        );
        ports.push(port);
    }
    let report = match plan.mode {
        Mode::Stack => {
            let (ev_tx, ev_rx) = bounded(4096);
            let macs: Vec<_> = ports.iter().map(|p| p.info().mac).collect();
            let net = plan.net.clone();
            run_workers(&eal, &ports, opts, stop, Some(ev_rx), move |_| {
                NetStack::new(&net, &macs, Some(ev_tx.clone()))
            })
        }
        Mode::Macswap => run_workers(&eal, &ports, opts, stop, None, |_| MacSwap),
    }?;
    let port_stats: Vec<_> = ports
        .iter()
        .map(|p| {
            let s = p.stats();
            // The driver's extended statistics, the non-zero ones.
            let xstats: serde_json::Map<String, serde_json::Value> =
                p.xstats().into_iter().filter(|(_, v)| *v != 0).map(|(k, v)| (k, json!(v))).collect();
            json!({"xstats": xstats, "device": p.name(), "driver": p.driver(), "mac": p.info().mac.to_string(),
                   "ipackets": s.ipackets, "opackets": s.opackets, "ibytes": s.ibytes, "obytes": s.obytes,
                   "imissed": s.imissed, "ierrors": s.ierrors, "oerrors": s.oerrors, "rx_nombuf": s.rx_nombuf})
        })
        .collect();
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

fn run_workers<H: ControlledHandler>(
    eal: &Eal,
    ports: &[DpdkPort],
    opts: &RunOptions,
    stop: Arc<AtomicBool>,
    events: Option<Receiver<NetEvent>>,
    make: impl Fn(usize) -> H,
) -> Result<serde_json::Value, RunError>
where
    H::Command: std::fmt::Debug,
{
    let clock = TscSource::new(eal);
    let mut cmds: Vec<Sender<Command<H::Command>>> = Vec::new();
    let mut counters: Vec<Arc<LcoreCounters>> = Vec::new();
    let lcores = ports.first().map(|p| p.queue_count()).unwrap_or(0);
    let mut launch_err = None;
    for i in 0..lcores {
        let (tx, rx) = unbounded();
        let c = Arc::new(LcoreCounters::default());
        let queues: Vec<DpdkQueue> = ports.iter().map(|p| p.queue(QueueId(i))).collect();
        let w = Worker::new(LcoreId(i), queues, make(i as usize), clock, c.clone(), rx);
        if let Err(e) = dpdk::launch(i as u32 + 1, move || drop(w.run())) {
            launch_err = Some(e);
            break;
        }
        cmds.push(tx);
        counters.push(c);
    }
    tracing::info!(workers = cmds.len(), "lcores running");

    let started = Instant::now();
    let mut links: Vec<bool> = vec![false; ports.len()];
    let mut pings: Vec<PingStats> = opts.ping.iter().map(|_| PingStats::default()).collect();
    let mut next_ping = started;
    let mut seq: u16 = 0;
    let ident = (std::process::id() & 0xffff) as u16;
    while launch_err.is_none() && !stop.load(Ordering::Relaxed) {
        if opts.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        for (i, p) in ports.iter().enumerate() {
            let up = p.link().up;
            if up != links[i] {
                links[i] = up;
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
                handle_event::<H>(e, &cmds, &opts.ping, &mut pings, ident);
            }
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
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
            handle_event::<H>(e, &[], &opts.ping, &mut pings, ident);
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
        json!({"lcores": lcores_json, "neighbors": neighbors, "pings": pings_json,
              "uptime_s": started.elapsed().as_secs_f64()}),
    )
}

fn handle_event<H: ControlledHandler>(
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
