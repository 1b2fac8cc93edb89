//! The two-QP harness (quinn's `Pair`, STYLE.md): simulated hosts with their RDMA objects,
//! connected to each other, and a pump that joins two of them through the simulator with
//! simulated time, links and faults. The RC tests, the fuzz target's operations ([`crate::ops`]),
//! the soak and incast runs (`dataplane::sim`) and the engine benchmarks all build on it.
//!
//! A [`Node`] is one host: a protection domain with one region over `mem` at `base`, RC QPs in
//! it, and a send and a receive CQ of its own per QP. [`sim_attr`] connects a QP of node `me`
//! to a QP of node `other` on [`Path::sim`]'s addressing. With the `testkit` feature (and in
//! this crate's tests), [`pump`] moves frames between two nodes over a `netsim` link pair
//! until both are idle; this crate's normal build does not depend on the simulator.

use crate::cq::CompletionQueue;
use crate::mr::{Access, MrTable};
use crate::qp::{Mtu, Path, QpAttr};
use crate::rc::{QpCaps, RcQp};
use wire::PacketBuf;
use wire::packet::{Checks, parse};
use wire::time::Instant;

/// What a simulated host is made of.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The region's virtual address.
    pub base: u64,
    /// The region's bytes.
    pub mem: Vec<u8>,
    /// The region's access.
    pub access: Access,
    /// Every QP's caps.
    pub caps: QpCaps,
    /// Entries of each CQ.
    pub cq_depth: usize,
}

impl NodeConfig {
    /// A region of `mem` at `base` allowing everything (local write, remote write, read and
    /// atomic), QPs of default caps, CQs of 4096 entries.
    pub fn new(base: u64, mem: Vec<u8>) -> Self {
        NodeConfig {
            base,
            mem,
            access: Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            caps: QpCaps::default(),
            cq_depth: 4096,
        }
    }
}

/// One simulated host: its regions, its QPs, and a send and a receive CQ per QP.
#[derive(Debug)]
pub struct Node {
    /// Its protection domain's regions (the first is the config's).
    pub mrs: MrTable,
    /// The key of the config's region.
    pub key: u32,
    /// Its QPs, in RESET until connected.
    pub qps: Vec<RcQp>,
    /// QP i's send CQ.
    pub scq: Vec<CompletionQueue>,
    /// QP i's receive CQ.
    pub rcq: Vec<CompletionQueue>,
}

impl Node {
    /// A host with one QP for each of `qpns`; panics on a config the objects refuse (a test's
    /// mistake).
    pub fn new(cfg: NodeConfig, qpns: &[u32]) -> Node {
        let mut mrs = MrTable::new();
        let pd = mrs.alloc_pd();
        let key = mrs
            .register(pd, cfg.base, Box::new(cfg.mem), cfg.access)
            .expect("the harness's region");
        let qps = qpns
            .iter()
            .map(|&q| RcQp::new(q, pd, cfg.caps).expect("the harness's QP caps"))
            .collect();
        Node {
            mrs,
            key,
            qps,
            scq: qpns
                .iter()
                .map(|_| CompletionQueue::new(cfg.cq_depth))
                .collect(),
            rcq: qpns
                .iter()
                .map(|_| CompletionQueue::new(cfg.cq_depth))
                .collect(),
        }
    }

    /// QP `i`'s next frame into `out`, if it has one ([`RcQp::poll_transmit`]).
    pub fn transmit<B: PacketBuf>(&mut self, i: usize, now: Instant, out: &mut B) -> bool {
        self.qps[i].poll_transmit(now, &self.mrs, &mut self.scq[i], &mut self.rcq[i], out)
    }

    /// QP `i` takes `frame` ([`RcQp::handle_frame`]).
    pub fn receive_on(&mut self, i: usize, now: Instant, frame: &[u8]) {
        self.qps[i].handle_frame(
            now,
            frame,
            &mut self.mrs,
            &mut self.scq[i],
            &mut self.rcq[i],
        );
    }

    /// The QP `frame` is addressed to takes it; false if it names none of this node's QPs
    /// (or does not parse).
    pub fn receive(&mut self, now: Instant, frame: &[u8]) -> bool {
        let Some(i) = parse(frame, Checks::NONE)
            .ok()
            .and_then(|p| self.qps.iter().position(|q| q.qpn == p.dest_qp))
        else {
            return false;
        };
        self.receive_on(i, now, frame);
        true
    }

    /// Runs every QP's timers due at `now`.
    pub fn handle_timeouts(&mut self, now: Instant) {
        for (i, qp) in self.qps.iter_mut().enumerate() {
            qp.handle_timeout(now, &mut self.scq[i], &mut self.rcq[i]);
        }
    }

    /// The earliest of its QPs' timers.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.qps.iter().filter_map(RcQp::poll_timeout).min()
    }
}

/// The attributes connecting QP `qpn` of simulated node `me` to QP `peer` of node `other` at
/// `mtu` ([`QpAttr::connect`]'s defaults on [`Path::sim`], the UDP source port from the QPN);
/// change fields with struct update syntax, then [`RcQp::connect`].
pub fn sim_attr(qpn: u32, me: u8, other: u8, peer: u32, mtu: Mtu) -> QpAttr {
    QpAttr::connect(
        Path::sim(me, other, 0xc000 | (qpn as u16 & 0x3fff)),
        mtu,
        peer,
    )
}

#[cfg(any(test, feature = "testkit"))]
pub use link::{LinkPair, pump};

#[cfg(any(test, feature = "testkit"))]
mod link {
    use super::Node;
    use netsim::{Faults, LinkConfig, NodeId, SimNet};
    use wire::time::Instant;

    /// The links between nodes 0 and 1 of [`pump`]: one config each way.
    #[derive(Clone, Copy, Debug)]
    pub struct LinkPair {
        /// From node 0 to node 1.
        pub ab: LinkConfig,
        /// From node 1 to node 0.
        pub ba: LinkConfig,
    }

    impl LinkPair {
        /// 1 us and 100 Gb/s each way, `ab`'s faults from node 0 to node 1, none back.
        pub fn fast(ab: Faults) -> Self {
            let l = LinkConfig {
                latency: core::time::Duration::from_micros(1),
                bandwidth_bps: 100_000_000_000,
                faults: Faults::default(),
            };
            LinkPair {
                ab: LinkConfig { faults: ab, ..l },
                ba: l,
            }
        }
    }

    /// Moves frames between `a` (node 0) and `b` (node 1) over `links` (a new seeded
    /// simulator), QP i of one talking to QP i of the other, running timers, from time
    /// `start` until nothing is left to do or the next event is past `until`; returns the
    /// time it stopped at. Like a NIC, a QP's next frame goes only when the link has
    /// finished the previous one. `drop` sees every frame (from node 0 or 1, at its time)
    /// and may discard it.
    pub fn pump(
        a: &mut Node,
        b: &mut Node,
        links: LinkPair,
        start: Instant,
        until: Instant,
        drop: &mut dyn FnMut(u16, &[u8], Instant) -> bool,
    ) -> Instant {
        let mut net = SimNet::new(1);
        let (na, nb) = (NodeId(0), NodeId(1));
        net.link(na, nb, links.ab);
        net.link(nb, na, links.ba);
        let mut now = start;
        let mut buf = Vec::new();
        loop {
            for (from, n, (src, dst)) in [(0u16, &mut *a, (na, nb)), (1, &mut *b, (nb, na))] {
                for i in 0..n.qps.len() {
                    while net.busy_until(src, dst) <= now && n.transmit(i, now, &mut buf) {
                        if !drop(from, &buf, now) {
                            net.send(now, src, dst, buf.clone());
                        }
                    }
                }
            }
            let link_free = [net.busy_until(na, nb), net.busy_until(nb, na)]
                .into_iter()
                .filter(|t| *t > now);
            let next = [net.next_delivery(), a.poll_timeout(), b.poll_timeout()]
                .into_iter()
                .flatten()
                .chain(link_free)
                .min();
            let Some(t) = next else { return now };
            if t > until {
                return now;
            }
            now = now.max(t);
            while let Some((_, to, f)) = net.deliver(now) {
                let n = if to == nb { &mut *b } else { &mut *a };
                n.receive(now, &f);
            }
            a.handle_timeouts(now);
            b.handle_timeouts(now);
        }
    }
}
