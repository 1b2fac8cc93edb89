//! The DCQCN scenarios: N senders, each with one RC QP streaming RDMA WRITEs to one receiver,
//! through a switch whose egress port toward the receiver is the bottleneck (N:1 incast), or
//! through a chain of switches (parking lot). Every endpoint is the real RC engine with its
//! congestion control; frames cross the simulator as bytes; senders hand a frame to their link
//! only when it is free, as a NIC does.
//!
//! What comes out is what the HPCC ns-3 reference reports: per-flow throughput in bins, the
//! bottleneck queue over time (time-weighted), utilisation, marks, CNPs and drops, and each
//! sender's DCQCN rate over time.

use super::{Faults, LinkConfig, NodeId, Pfc, PortStats, Red, SimNet, SwitchConfig};
use crate::cc::{Cc, CcKind, DcqcnParams};
use crate::time::Instant;
use crate::transport::mr::Access;
use crate::transport::qp::{Mtu, QpAttr};
use crate::transport::rc::RcQp;
use crate::transport::testkit::{Node, NodeConfig, sim_attr};
use crate::transport::wr::{SendOp, SendWr, Sge};
use crate::wire::packet::{Checks, parse};
use core::time::Duration;

/// Where the flows go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Every sender into one switch, out of one port to the receiver.
    Incast,
    /// Switches in a chain toward the receiver; sender 0 enters at the first and crosses them
    /// all, the others enter at the last (so the last hop is the shared bottleneck and flow 0
    /// has the longest path).
    ParkingLot {
        /// Switches in the chain (1-4).
        hops: u8,
    },
}

/// One run.
#[derive(Clone, Copy, Debug)]
pub struct IncastConfig {
    /// Senders.
    pub senders: usize,
    /// Congestion control of every QP.
    pub cc: CcKind,
    /// DCQCN settings.
    pub params: DcqcnParams,
    /// Rate of every link and port, bits per second.
    pub link_bps: u64,
    /// Propagation delay of every link.
    pub latency: Duration,
    /// Simulated time.
    pub duration: Duration,
    /// Seed (RED's marking draws).
    pub seed: u64,
    /// ECN marking at the switches.
    pub red: Red,
    /// Shared buffer of each switch.
    pub buffer_bytes: u64,
    /// PFC at the switches: pause the links into a switch before its buffer overflows
    /// (headroom for what is in flight on every ingress link), resume 3 KB lower.
    pub pfc: bool,
    /// Path MTU.
    pub mtu: Mtu,
    /// WRITE size; each sender keeps `depth` of them posted.
    pub message: u32,
    /// WRITEs outstanding per sender.
    pub depth: usize,
    /// Queue and rate sampling period.
    pub sample: Duration,
    /// Throughput bin.
    pub bin: Duration,
    /// Topology.
    pub topology: Topology,
}

impl IncastConfig {
    /// The HPCC ns-3 reference setup at `senders`:1 (100 Gb/s, 1 us links, Kmin 400 KB,
    /// Kmax 1600 KB, Pmax 0.2, 32 MB buffer, its DCQCN parameters), 50 ms.
    pub fn reference(senders: usize) -> Self {
        IncastConfig {
            senders,
            cc: CcKind::Dcqcn,
            params: DcqcnParams::hpcc_ns3(),
            link_bps: 100_000_000_000,
            latency: Duration::from_micros(1),
            duration: Duration::from_millis(50),
            seed: 1,
            red: Red {
                kmin: 400_000,
                kmax: 1_600_000,
                pmax: 0.2,
            },
            buffer_bytes: 32 << 20,
            pfc: false,
            mtu: Mtu::M1024,
            // 16 MiB posted per sender: more than the switch buffer holds, so without
            // congestion control the senders overflow it (the reference's flows are 2 GB).
            message: 1 << 20,
            depth: 16,
            sample: Duration::from_micros(10),
            bin: Duration::from_micros(100),
            topology: Topology::Incast,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct IncastReport {
    /// Wire bytes (frame, preamble, FCS and inter-frame gap) each flow delivered to the
    /// receiver in each bin: `bins[bin][flow]`. Measured like the reference (wire bytes at the
    /// bottleneck), so the flows of a full link add up to the link rate.
    pub bins: Vec<Vec<u64>>,
    /// RDMA payload bytes delivered in all.
    pub payload: u64,
    /// Bottleneck queue, bytes, every `sample`.
    pub queue: Vec<u64>,
    /// Each sender's rate, bits per second, every `sample`: `rates[sample][flow]`.
    pub rates: Vec<Vec<f64>>,
    /// The bottleneck port.
    pub port: PortStats,
    /// Drops at every switch.
    pub drops: u64,
    /// PFC pause episodes at every switch.
    pub pauses: u64,
    /// CE marks at every switch.
    pub marked: u64,
    /// CNPs the receiver sent.
    pub cnps: u64,
    /// Wire time the bottleneck was busy, nanoseconds.
    pub busy_ns: u64,
    /// The run's config.
    pub sample_ns: u64,
    /// Bin length, ns.
    pub bin_ns: u64,
    /// Simulated ns.
    pub duration_ns: u64,
    /// Bottleneck rate.
    pub link_bps: u64,
    /// Work requests that completed with an error (none expected).
    pub errors: u64,
}

/// Jain's fairness index of `x`.
pub fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let s2: f64 = x.iter().map(|v| v * v).sum();
    if s2 == 0.0 {
        1.0
    } else {
        s * s / (x.len() as f64 * s2)
    }
}

impl IncastReport {
    /// Per-flow mean throughput over the second half, bits per second.
    pub fn second_half_rates(&self) -> Vec<f64> {
        let n = self.bins.first().map_or(0, |b| b.len());
        let half = &self.bins[self.bins.len() / 2..];
        let secs = half.len() as f64 * self.bin_ns as f64 / 1e9;
        (0..n)
            .map(|f| half.iter().map(|b| b[f]).sum::<u64>() as f64 * 8.0 / secs.max(1e-12))
            .collect()
    }

    /// Jain's index on the per-flow mean throughput of the second half.
    pub fn jain_second_half(&self) -> f64 {
        jain(&self.second_half_rates())
    }

    /// Fraction of the run the bottleneck was sending.
    pub fn utilisation(&self) -> f64 {
        self.busy_ns as f64 / self.duration_ns.max(1) as f64
    }

    /// First bin from which every later bin of `width` bins has all flows within 10 % of the
    /// fair share of the bottleneck, in ns (None: never).
    pub fn settle_ns(&self, width: usize) -> Option<u64> {
        let n = self.bins.first()?.len();
        let fair = self.link_bps as f64 / n as f64;
        let ok: Vec<bool> = self
            .bins
            .chunks(width.max(1))
            .map(|c| {
                let secs = c.len() as f64 * self.bin_ns as f64 / 1e9;
                (0..n).all(|f| {
                    let r = c.iter().map(|b| b[f]).sum::<u64>() as f64 * 8.0 / secs;
                    (r - fair).abs() <= 0.1 * fair
                })
            })
            .collect();
        let last_bad = ok.iter().rposition(|o| !o);
        match last_bad {
            None => Some(0),
            Some(i) if i + 1 < ok.len() => Some((i as u64 + 1) * width as u64 * self.bin_ns),
            _ => None,
        }
    }

    /// Queue samples of the second half.
    fn queue_half(&self) -> &[u64] {
        &self.queue[self.queue.len() / 2..]
    }

    /// Mean, p99 and max of the sampled queue over the second half, bytes.
    pub fn queue_second_half(&self) -> (f64, u64, u64) {
        let q = self.queue_half();
        let mean = q.iter().sum::<u64>() as f64 / q.len().max(1) as f64;
        let mut s = q.to_vec();
        s.sort_unstable();
        let p99 = s.get(((s.len() as f64 * 0.99) as usize).min(s.len().saturating_sub(1)));
        (
            mean,
            p99.copied().unwrap_or(0),
            s.last().copied().unwrap_or(0),
        )
    }

    /// Fraction of queue samples above `bytes`.
    pub fn fraction_above(&self, bytes: u64) -> f64 {
        self.queue.iter().filter(|q| **q > bytes).count() as f64 / self.queue.len().max(1) as f64
    }
}

const BASE: u64 = 0x1000_0000;
const RECEIVER: NodeId = NodeId(0);
const SWITCH0: u16 = 1000;

fn sender_node(i: usize) -> NodeId {
    NodeId(1 + i as u16)
}

fn endpoint(qpns: &[u32], mem: usize, cc: CcKind, p: DcqcnParams, line: f64) -> Node {
    let mut n = Node::new(
        NodeConfig {
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            ..NodeConfig::new(BASE, vec![0x5au8; mem])
        },
        qpns,
    );
    for qp in &mut n.qps {
        qp.set_congestion_control(cc, line, p);
    }
    n
}

fn connect(qp: &mut RcQp, me: u8, other: u8, peer: u32, mtu: Mtu) {
    let c = QpAttr {
        access: Some(Access::REMOTE_WRITE),
        ..sim_attr(qp.qpn, me, other, peer, mtu)
    };
    qp.connect(&c).expect("connect");
}

/// Runs one scenario.
pub fn run(cfg: &IncastConfig) -> IncastReport {
    let n = cfg.senders.clamp(1, 200);
    let line = cfg.link_bps as f64;
    let mut senders: Vec<Node> = (0..n)
        .map(|i| {
            endpoint(
                &[0x100 + i as u32],
                cfg.message as usize,
                cfg.cc,
                cfg.params,
                line,
            )
        })
        .collect();
    let rq: Vec<u32> = (0..n).map(|i| 0x1000 + i as u32).collect();
    let mut recv = endpoint(&rq, cfg.message as usize, cfg.cc, cfg.params, line);
    for (i, s) in senders.iter_mut().enumerate() {
        let me = 1 + i as u8;
        connect(&mut s.qps[0], me, 250, rq[i], cfg.mtu);
        connect(&mut recv.qps[i], 250, me, 0x100 + i as u32, cfg.mtu);
    }

    let mut net = SimNet::new(cfg.seed);
    let link = LinkConfig {
        latency: cfg.latency,
        bandwidth_bps: cfg.link_bps,
        faults: Faults::default(),
    };
    // PFC headroom: per ingress link, a round trip of data at line rate (the pause takes one
    // link delay to arrive, frames already on the wire one more) and two full frames.
    let ingress = n as u64 + 1;
    let bdp = cfg.link_bps / 8 * cfg.latency.as_nanos() as u64 / 1_000_000_000;
    let headroom = ingress * (2 * bdp + 2 * (cfg.mtu.bytes() as u64 + 100));
    let xoff = cfg.buffer_bytes.saturating_sub(headroom);
    let sw = SwitchConfig {
        buffer_bytes: cfg.buffer_bytes,
        red: Some(cfg.red),
        port_bps: cfg.link_bps,
        latency: cfg.latency,
        pfc: cfg.pfc.then_some(Pfc {
            xoff,
            xon: xoff.saturating_sub(3000),
        }),
    };
    let hops = match cfg.topology {
        Topology::Incast => 1,
        Topology::ParkingLot { hops } => hops.clamp(1, 4),
    };
    let switches: Vec<NodeId> = (0..hops as u16).map(|h| NodeId(SWITCH0 + h)).collect();
    for s in &switches {
        net.add_switch(*s, sw);
    }
    let last = *switches.last().expect("a switch");
    net.link(RECEIVER, last, link);
    for i in 0..n {
        let s = sender_node(i);
        // Sender 0 enters at the first switch of a parking lot; everyone else at the last.
        let path: &[NodeId] = if i == 0 {
            &switches
        } else {
            &switches[switches.len() - 1..]
        };
        net.link(s, path[0], link);
        net.route(s, RECEIVER, path);
        let back: Vec<NodeId> = path.iter().rev().copied().collect();
        net.route(RECEIVER, s, &back);
    }

    let mut rep = IncastReport {
        sample_ns: cfg.sample.as_nanos() as u64,
        bin_ns: cfg.bin.as_nanos() as u64,
        duration_ns: cfg.duration.as_nanos() as u64,
        link_bps: cfg.link_bps,
        ..Default::default()
    };
    let end = Instant(rep.duration_ns);
    let mut now = Instant::ZERO;
    let mut buf = Vec::new();
    let mut next_sample = Instant::ZERO;
    let mut bin = vec![0u64; n];
    let mut next_bin = Instant(rep.bin_ns);
    let mut posted = vec![0usize; n];
    let mut wcs = Vec::new();
    let mut next_id = 0u64;
    let tx_ns = |len: usize| ((len as u128 + 24) * 8 * 1_000_000_000 / cfg.link_bps as u128) as u64;
    loop {
        // Keep every sender's send queue full.
        for (i, s) in senders.iter_mut().enumerate() {
            wcs.clear();
            s.scq[0].poll(usize::MAX, &mut wcs);
            for c in &wcs {
                posted[i] -= 1;
                if c.status != crate::transport::cq::WcStatus::Success {
                    rep.errors += 1;
                }
            }
            while posted[i] < cfg.depth {
                let mut sg = crate::transport::wr::SgList::new();
                sg.push(Sge {
                    addr: BASE,
                    length: cfg.message,
                    lkey: s.key,
                });
                next_id += 1;
                let wr = SendWr {
                    wr_id: next_id,
                    op: SendOp::Write {
                        remote_addr: BASE,
                        rkey: recv.key,
                    },
                    sg,
                    signaled: true,
                    solicited: false,
                    fence: false,
                    inline: false,
                    ud: None,
                };
                if s.qps[0].post_send(&wr, wr.wr_id, None).is_err() {
                    break;
                }
                posted[i] += 1;
            }
        }
        // Transmit while links are free.
        for (i, s) in senders.iter_mut().enumerate() {
            let node = sender_node(i);
            while net.busy_until(node, RECEIVER) <= now && s.transmit(0, now, &mut buf) {
                net.send(now, node, RECEIVER, buf.clone());
            }
        }
        for i in 0..recv.qps.len() {
            let to = sender_node(i);
            while net.busy_until(RECEIVER, to) <= now && recv.transmit(i, now, &mut buf) {
                net.send(now, RECEIVER, to, buf.clone());
            }
        }
        // Next event.
        let mut next = net.next_delivery();
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t
                && t > now
                && t.0 != u64::MAX
            {
                next = Some(next.map_or(t, |x| x.min(t)));
            }
        };
        consider(Some(next_sample));
        for (i, s) in senders.iter().enumerate() {
            consider(s.qps[0].poll_timeout());
            consider(Some(net.busy_until(sender_node(i), RECEIVER)));
        }
        for (i, qp) in recv.qps.iter().enumerate() {
            consider(qp.poll_timeout());
            consider(Some(net.busy_until(RECEIVER, sender_node(i))));
        }
        let Some(t) = next else { break };
        if t >= end {
            break;
        }
        now = now.max(t);
        while now >= next_sample {
            rep.queue.push(net.queue_bytes(last, RECEIVER));
            rep.rates.push(
                senders
                    .iter()
                    .map(|s| match s.qps[0].cc() {
                        Cc::Dcqcn(d) => d.rate(),
                        Cc::None { line, .. } => *line,
                    })
                    .collect(),
            );
            next_sample = next_sample + cfg.sample;
        }
        while now >= next_bin {
            rep.bins.push(core::mem::replace(&mut bin, vec![0; n]));
            next_bin = next_bin + cfg.bin;
        }
        while let Some((from, to, f)) = net.deliver(now) {
            let Ok(p) = parse(&f, Checks::NONE) else {
                continue;
            };
            if to == RECEIVER {
                let i = (from.0 - 1) as usize;
                bin[i] += f.len() as u64 + 24;
                rep.payload += p.payload_len as u64;
                rep.busy_ns += tx_ns(f.len());
                let q = (p.dest_qp - 0x1000) as usize;
                if q < recv.qps.len() {
                    recv.receive_on(q, now, &f);
                }
            } else {
                senders[(to.0 - 1) as usize].receive_on(0, now, &f);
            }
        }
        for s in senders.iter_mut() {
            s.handle_timeouts(now);
        }
        recv.handle_timeouts(now);
    }
    rep.port = net.port_stats(last, RECEIVER, end).unwrap_or_default();
    rep.pauses = switches.iter().map(|s| net.pauses(*s)).sum();
    for (_, st) in net.ports() {
        rep.drops += st.dropped;
        rep.marked += st.marked;
    }
    rep.cnps = recv.qps.iter().map(|q| q.counters.np_cnp_sent).sum();
    if std::env::var_os("INCAST_DEBUG").is_some() {
        for (i, q) in recv.qps.iter().enumerate() {
            let (h, ig) = senders[i].qps[0].cc().cnp_counts();
            eprintln!(
                "flow {i}: marked {} cnps {} handled {h} ignored {ig} alpha {:.4}",
                q.counters.np_ecn_marked_roce_packets,
                q.counters.np_cnp_sent,
                match senders[i].qps[0].cc() {
                    Cc::Dcqcn(d) => d.alpha(end, &cfg.params),
                    _ => 0.0,
                }
            );
        }
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short(senders: usize, cc: CcKind, buffer: u64) -> IncastReport {
        run(&IncastConfig {
            cc,
            duration: Duration::from_millis(5),
            buffer_bytes: buffer,
            ..IncastConfig::reference(senders)
        })
    }

    #[test]
    fn dcqcn_keeps_a_2_to_1_incast_lossless_and_none_overflows() {
        let d = short(2, CcKind::Dcqcn, 4 << 20);
        assert_eq!((d.errors, d.drops), (0, 0), "{:?}", d.port);
        assert!(
            d.cnps > 0 && d.marked == d.cnps,
            "every mark answered by a CNP"
        );
        assert!(d.port.max_bytes < 1_000_000, "queue {}", d.port.max_bytes);
        assert!(d.utilisation() > 0.8, "{}", d.utilisation());
        // The senders were cut below line rate at some point and paced.
        assert!(d.rates.iter().flatten().any(|r| *r < 50e9));
        let n = short(2, CcKind::None, 4 << 20);
        assert!(
            n.drops > 0,
            "without congestion control the buffer overflows"
        );
        assert!(n.port.max_bytes > 4_000_000);
        assert!(n.rates.iter().flatten().all(|r| *r == 100e9));
    }

    #[test]
    fn pfc_keeps_an_8_to_1_burst_lossless_in_a_buffer_of_kmax() {
        let small = |pfc| {
            run(&IncastConfig {
                duration: Duration::from_millis(2),
                buffer_bytes: 1_600_000,
                pfc,
                ..IncastConfig::reference(8)
            })
        };
        let without = small(false);
        assert!(without.drops > 0, "the start-up burst overflows Kmax");
        let with = small(true);
        assert_eq!((with.drops, with.errors), (0, 0));
        assert!(with.pauses > 0);
        assert!(with.port.max_bytes <= 1_600_000);
    }

    #[test]
    fn parking_lot_routes_the_long_flow_through_every_switch() {
        let r = run(&IncastConfig {
            duration: Duration::from_millis(3),
            topology: Topology::ParkingLot { hops: 3 },
            ..IncastConfig::reference(3)
        });
        assert_eq!((r.errors, r.drops), (0, 0));
        let total: Vec<u64> = (0..3).map(|f| r.bins.iter().map(|b| b[f]).sum()).collect();
        assert!(total.iter().all(|t| *t > 0), "{total:?}");
    }

    #[test]
    fn jain_index() {
        assert!((jain(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
    }
}
