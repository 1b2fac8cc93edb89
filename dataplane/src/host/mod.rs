//! The RDMA transport on an lcore: an [`RdmaHost`] runs one shard of the sans-IO
//! [`Device`] and its perftest [`Tests`] as a [`Handler`] of the poll loop.
//!
//! This is the glue between the loop and the device, and all it does: each received frame is
//! parsed once, with every check (checksums, ICRC), and given to the device, or, if its QP
//! belongs to another lcore's shard ([`shard_of`]: ports without RSS, or flows hashed
//! elsewhere), handed to its owner through a lock-free single-producer single-consumer ring
//! ([`RdmaHost::sharded`]), counted as a handoff. Then the device's events go to the tests,
//! its timers run, and it transmits into the loop's port queues through [`Transmit`] (a spare
//! buffer kept for the next frame when a QP had nothing to send).
//!
//! The control thread (and applications in the process) drive the shard with
//! [`RdmaCommand`]s over the loop's command channel: each is a closure over the [`Shard`]
//! that calls one verb of the device or starts one test, and sends its answer back on a
//! channel ([`ask`] makes one and waits). Memory regions belong to the lcore they were
//! registered on, unless registered node-wide (`Device::reg_shared`).

mod app;
mod kit;
#[cfg(test)]
mod tests;

pub use app::{AppCounters, AppError, AppQueues, Apps, ENTRIES_PER_POLL, Fault};
pub use kit::{Asker, PAIR_VA, Pair, connect_pair, connect_pair_with, pair_check};

use crate::PacketBuf;
use crate::counters::DropReason;
use crate::lcore::{Handler, Io};
use crate::port::{Burst, PortQueue};
use crate::time::Instant;
use crate::wire::packet::{Checks, parse};
use crossbeam_channel::Sender;
use transport::device::{Device, DeviceCounters, Transmit};
use transport::gsi::{Gsi, GsiCounters};
use transport::perftest::{Reply, TestError, Tests};

pub use transport::device::{QPN_QUARANTINE, QPN_SHARD_SHIFT, shard_of};
use wire::mad::GSI_QPN;

/// Frames all QPs together may queue per loop iteration: about what the loop receives per
/// iteration ([`crate::lcore::RX_BURSTS_PER_POLL`] bursts), so ACKs keep pace with the data
/// they acknowledge however many QPs send.
const TX_PER_POLL: usize = crate::lcore::RX_BURSTS_PER_POLL * crate::BURST_SIZE;
/// Frames each handoff ring holds.
pub const HANDOFF_RING: usize = 4096;

/// An lcore's shard of the RNIC: the device, the tests running on it and the handoff
/// counters; what an [`RdmaCommand`] works on.
#[derive(Debug)]
pub struct Shard {
    /// The QPs, CQs and memory regions.
    pub dev: Device,
    /// perftest's streams and latency tests.
    pub tests: Tests,
    /// The QPs applications drive through shared-memory rings.
    pub apps: Apps,
    /// Frames handed to the lcore owning their QP.
    pub handoffs: u64,
    /// Frames dropped because a handoff ring was full.
    pub handoff_drops: u64,
    /// QP1 and the port's connection manager, on the shard that owns QPN 1 (shard 0).
    pub gsi: Option<Gsi>,
    /// Where the CM's events go (the control plane's CM, once it started): sent without
    /// waiting, lost and counted when it is full.
    pub cm_events: Option<crossbeam_channel::Sender<transport::cm::Event>>,
}

impl Shard {
    /// What the lcore reports: its device's counters at `now`, its handoffs and its QP1's.
    pub fn counters(&self, now: Instant) -> HostCounters {
        HostCounters {
            dev: self.dev.counters(now),
            handoffs: self.handoffs,
            handoff_drops: self.handoff_drops,
            cm: self
                .gsi
                .as_ref()
                .map(|g| *g.cm.counters())
                .unwrap_or_default(),
            gsi: self.gsi.as_ref().map(|g| *g.counters()).unwrap_or_default(),
        }
    }
}

/// What an lcore's host reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostCounters {
    /// Its device's: the QPs' counters (destroyed QPs included), states and DCQCN.
    pub dev: DeviceCounters,
    /// Frames it handed to the lcore owning their QP.
    pub handoffs: u64,
    /// Frames dropped because a handoff ring was full.
    pub handoff_drops: u64,
    /// Its connection manager's (zero on an lcore without QP1).
    pub cm: transport::cm::Counters,
    /// Its QP1's framing (zero on an lcore without QP1).
    pub gsi: GsiCounters,
}

type Job = Box<dyn FnOnce(&mut Shard, Instant) + Send>;

/// What the control side asks of an lcore's shard: one verb or test, run on the lcore at its
/// time; its answer goes back on the channel the command was made with.
pub struct RdmaCommand(Job);

impl core::fmt::Debug for RdmaCommand {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("RdmaCommand")
    }
}

impl RdmaCommand {
    /// Runs `f` on the shard and sends what it answers on `reply`.
    pub fn call<T: Send + 'static>(
        reply: Sender<T>,
        f: impl FnOnce(&mut Shard, Instant) -> T + Send + 'static,
    ) -> Self {
        RdmaCommand(Box::new(move |s, now| {
            let _ = reply.send(f(s, now));
        }))
    }

    /// Starts a test with `f`, which hands the test a [`Reply`] that sends its result on
    /// `reply` (dropped unanswered if its QP is destroyed).
    pub fn test<T: Send + 'static>(
        reply: Sender<Result<T, TestError>>,
        f: impl FnOnce(&mut Shard, Instant, Reply<T>) + Send + 'static,
    ) -> Self {
        RdmaCommand(Box::new(move |s, now| {
            let r: Reply<T> = Box::new(move |v| {
                let _ = reply.send(v);
            });
            f(s, now, r)
        }))
    }
}

/// This lcore's RDMA state.
pub struct RdmaHost<B> {
    shard: Shard,
    /// A buffer allocated for a QP that then had nothing to send, kept for the next one.
    spare: Option<B>,
    /// Rings to the other shards (index = shard; None for this one).
    to: Vec<Option<rtrb::Producer<B>>>,
    /// Rings from the other shards.
    from: Vec<rtrb::Consumer<B>>,
}

impl<B> core::fmt::Debug for RdmaHost<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RdmaHost")
            .field("dev", &self.shard.dev)
            .finish()
    }
}

impl<B: PacketBuf> RdmaHost<B> {
    /// A host for shard `shard` (0-15) sending on `port` of `line_bps`.
    pub fn new(shard: u32, port: usize, line_bps: f64) -> Self {
        RdmaHost {
            shard: Shard {
                dev: Device::new(shard, port, line_bps),
                tests: Tests::default(),
                apps: Apps::default(),
                handoffs: 0,
                handoff_drops: 0,
                gsi: (shard == shard_of(GSI_QPN)).then(|| Gsi::new(port, gsi_config(shard))),
                cm_events: None,
            },
            spare: None,
            to: Vec::new(),
            from: Vec::new(),
        }
    }

    /// `n` hosts (shards 0..n, one per lcore) sending on `port`, joined by handoff rings in
    /// both directions between every pair.
    pub fn sharded(n: usize, port: usize, line_bps: f64) -> Vec<Self> {
        let mut hosts: Vec<Self> = (0..n)
            .map(|i| Self::new(i as u32, port, line_bps))
            .collect();
        for h in hosts.iter_mut() {
            h.to = (0..n).map(|_| None).collect();
        }
        for src in 0..n {
            for dst in 0..n {
                if src != dst {
                    let (p, c) = rtrb::RingBuffer::new(HANDOFF_RING);
                    hosts[src].to[dst] = Some(p);
                    hosts[dst].from.push(c);
                }
            }
        }
        hosts
    }

    /// The shard (for a driver that runs the host itself).
    pub fn shard(&mut self) -> &mut Shard {
        &mut self.shard
    }

    /// Gives a frame parsed here to the device (a drop if its QP is not here).
    #[inline(always)]
    fn deliver<Q: PortQueue<Buf = B>>(
        &mut self,
        now: Instant,
        info: &crate::wire::packet::PacketInfo,
        buf: B,
        io: &mut Io<'_, Q>,
    ) {
        if info.dest_qp == GSI_QPN {
            match self.shard.gsi.as_mut() {
                Some(g) => g.receive(now, info, buf.data()),
                None => io.drop_frame(DropReason::NotForUs, buf),
            }
            return;
        }
        if self.shard.dev.handle_frame(now, info, buf.data()).is_err() {
            io.drop_frame(DropReason::NotForUs, buf);
        }
    }

    /// The device's events to the tests and the applications' queues (what the iteration's
    /// frames, timers or command did to their QPs: once per QP however many frames it took),
    /// then what the ready QPs have to send. Events that sending raises wait for the next
    /// iteration.
    fn flush<Q: PortQueue<Buf = B>>(&mut self, io: &mut Io<'_, Q>) {
        let now = io.now;
        let s = &mut self.shard;
        while let Some(e) = s.dev.poll_event() {
            s.apps.on_event(&e);
            s.tests.handle_event(&mut s.dev, e, now);
        }
        if let (Some(g), Some(to)) = (s.gsi.as_mut(), s.cm_events.as_ref()) {
            g.drain_events(|e| to.try_send(e).is_ok());
        }
        let gsi_tx = s.gsi.as_ref().is_some_and(|g| g.has_tx());
        if s.dev.has_ready() || gsi_tx {
            let mut tx = LcoreTx {
                io,
                spare: &mut self.spare,
            };
            if let Some(g) = s.gsi.as_mut().filter(|_| gsi_tx) {
                g.transmit(&mut tx);
            }
            s.dev.transmit(now, TX_PER_POLL, &mut tx);
        }
    }
}

/// The loop's port queues as the device's [`Transmit`] sink.
struct LcoreTx<'a, 'b, Q: PortQueue> {
    io: &'a mut Io<'b, Q>,
    spare: &'a mut Option<Q::Buf>,
}

impl<Q: PortQueue> Transmit<Q::Buf> for LcoreTx<'_, '_, Q> {
    #[inline]
    fn tx_features(&self, port: usize) -> (bool, bool) {
        let caps = self.io.info(port).caps;
        (caps.tx_ipv4_cksum, caps.tx_multi_seg)
    }

    #[inline]
    fn can_send(&mut self, port: usize) -> bool {
        self.io.can_send(port)
    }

    #[inline]
    fn alloc(&mut self, port: usize) -> Option<Q::Buf> {
        match self.spare.take() {
            Some(b) => Some(b),
            None => self.io.alloc(port),
        }
    }

    #[inline]
    fn send(&mut self, port: usize, buf: Q::Buf) {
        self.io.send(port, buf)
    }

    #[inline]
    fn unused(&mut self, buf: Q::Buf) {
        *self.spare = Some(buf);
    }
}

impl<Q: PortQueue> Handler<Q> for RdmaHost<Q::Buf> {
    type Command = RdmaCommand;

    fn on_burst(&mut self, _port: usize, burst: &mut Burst<Q::Buf>, io: &mut Io<'_, Q>) {
        let now = io.now;
        for buf in burst.drain(..) {
            // Parsed once, with every check (checksums, ICRC), here; the QP takes the result
            // (by reference where it lies: moving it out costs a memcpy a frame).
            let parsed = parse(buf.data(), Checks::ALL);
            let info = match &parsed {
                Ok(info) => info,
                Err(_) => {
                    io.drop_frame(DropReason::Malformed, buf);
                    continue;
                }
            };
            let owner = shard_of(info.dest_qp) as usize;
            if owner != self.shard.dev.shard() as usize {
                match self.to.get_mut(owner).and_then(|p| p.as_mut()) {
                    Some(p) => match p.push(buf) {
                        Ok(()) => self.shard.handoffs += 1,
                        Err(rtrb::PushError::Full(buf)) => {
                            self.shard.handoff_drops += 1;
                            io.drop_frame(DropReason::TxFull, buf);
                        }
                    },
                    None => io.drop_frame(DropReason::NotForUs, buf),
                }
                continue;
            }
            self.deliver(now, info, buf, io);
        }
    }

    fn on_poll(&mut self, io: &mut Io<'_, Q>) {
        let now = io.now;
        for r in 0..self.from.len() {
            for _ in 0..crate::BURST_SIZE {
                let Ok(buf) = self.from[r].pop() else { break };
                match parse(buf.data(), Checks::ALL) {
                    Ok(info) => self.deliver(now, &info, buf, io),
                    Err(_) => io.drop_frame(DropReason::Malformed, buf),
                }
            }
        }
        let s = &mut self.shard;
        if !s.apps.is_empty() {
            s.apps.poll(&mut s.dev, now);
        }
        s.tests.poll(&mut s.dev, now);
        s.dev.handle_timeouts(now);
        if let Some(g) = s.gsi.as_mut() {
            g.poll(now);
        }
        self.flush(io);
    }

    fn on_command(&mut self, cmd: RdmaCommand, io: &mut Io<'_, Q>) {
        (cmd.0)(&mut self.shard, io.now);
        self.flush(io);
    }

    fn shutdown(&mut self) {
        self.spare = None;
        self.shard.dev.clear();
        for r in self.from.iter_mut() {
            while r.pop().is_ok() {}
        }
    }
}

/// The connection manager of shard `shard`'s QP1: randomness for its IDs from the OS, a REQ
/// for a port nobody listens on refused after 250 ms rather than at once (an application's
/// `rdma_listen` is a round trip to roced, and perftest -R's client connects its test QPs
/// right behind the barrier its server listens after), the rest as IBTA and rdma_cm use it.
fn gsi_config(shard: u32) -> transport::cm::Config {
    use std::hash::BuildHasher;
    transport::cm::Config {
        seed: std::collections::hash_map::RandomState::new().hash_one(shard),
        listen_grace: std::time::Duration::from_millis(250),
        ..transport::cm::Config::default()
    }
}

/// A host's command channel, as the control side holds it.
pub type HostControl = Sender<crate::lcore::Command<RdmaCommand>>;

/// Runs `f` on the lcore behind `ctl` and waits (10 s at most) for its answer.
pub fn ask<T: Send + 'static>(
    ctl: &HostControl,
    f: impl FnOnce(&mut Shard, Instant) -> T + Send + 'static,
) -> Result<T, String> {
    send_and_wait(ctl, |tx| RdmaCommand::call(tx, f), LCORE_WAIT)
}

/// Starts a test with `f` on the lcore behind `ctl` and waits up to `wait` for its result.
pub fn ask_test<T: Send + 'static>(
    ctl: &HostControl,
    wait: std::time::Duration,
    f: impl FnOnce(&mut Shard, Instant, Reply<T>) + Send + 'static,
) -> Result<Result<T, TestError>, String> {
    send_and_wait(ctl, |tx| RdmaCommand::test(tx, f), wait)
}

const LCORE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn send_and_wait<T>(
    ctl: &HostControl,
    make: impl FnOnce(Sender<T>) -> RdmaCommand,
    wait: std::time::Duration,
) -> Result<T, String> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    ctl.send(crate::lcore::Command::Handler(make(tx)))
        .map_err(|_| "the lcore has stopped".to_string())?;
    rx.recv_timeout(wait)
        .map_err(|_| format!("the lcore did not answer in {wait:?}"))
}
