//! The poll loop each worker lcore runs.
//!
//! A worker owns queue `i` of every port. Each iteration it receives a burst from each port and
//! hands it to its [`Handler`], lets the handler run its timers, transmits what the handler
//! queued, and every [`COMMAND_POLL_INTERVAL`] iterations (or whenever idle) takes commands from
//! the control thread's channel. Nothing here allocates or blocks.

use crate::counters::{DropReason, LcoreCounters};
use crate::hint::prefetch;
use crate::port::{Burst, PortInfo, PortQueue};
use crate::{PacketBuf, time::Instant};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use std::sync::Arc;

/// Iterations between two looks at the command channel. Looking costs about as much as an
/// empty rx poll, so doing it every iteration would slow the reaction to the next burst.
pub const COMMAND_POLL_INTERVAL: u32 = 64;
/// While idle, iterations between two looks at the command channel (a control round trip
/// then waits a few hundred nanoseconds, not a whole busy interval or idle sleep).
pub const IDLE_COMMAND_POLL_INTERVAL: u32 = 8;

/// Bursts received from one port per iteration at most (while each comes back full).
pub const RX_BURSTS_PER_POLL: usize = 4;

/// Index of a worker lcore (0-based among the workers, not DPDK's lcore id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LcoreId(pub u16);

/// A source of [`Instant`]s for the loop: the TSC on lcores, the OS clock in tests.
pub trait Clock: Send {
    /// Now.
    fn now(&self) -> Instant;
}

/// The OS's monotonic clock, for backends that are not DPDK.
#[derive(Debug, Clone, Copy)]
pub struct StdClock(pub std::time::Instant);

impl StdClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        StdClock(std::time::Instant::now())
    }
}

impl Default for StdClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for StdClock {
    fn now(&self) -> Instant {
        Instant(self.0.elapsed().as_nanos() as u64)
    }
}

/// A clock that moves only when told: for tests and the simulator.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<core::sync::atomic::AtomicU64>);

impl ManualClock {
    /// Sets the time.
    pub fn set(&self, t: Instant) {
        self.0.store(t.0, core::sync::atomic::Ordering::Relaxed);
    }
    /// Moves time forward.
    pub fn advance(&self, d: core::time::Duration) {
        self.0
            .fetch_add(d.as_nanos() as u64, core::sync::atomic::Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        Instant(self.0.load(core::sync::atomic::Ordering::Relaxed))
    }
}

/// A command from the control thread.
#[derive(Debug)]
pub enum Command<C> {
    /// Leave the loop: drop everything held and return.
    Stop,
    /// Stop touching the ports, keep taking commands: no more rx or tx bursts (what the handler
    /// sends from now on is dropped and counted as [`DropReason::Shutdown`]). The sender is
    /// answered once the worker is between burst calls and will make no more. A node sends it
    /// before it closes its ports at a stop: DPDK 22.11's memif driver unmaps a port's rings
    /// when the peer disconnects, from its interrupt thread, with nothing to keep an lcore
    /// that is inside a burst call from reading them.
    Detach(Sender<()>),
    /// Stop touching one port, as [`Command::Detach`] does for all (answered the same way):
    /// before the port is stopped and started again, as a memif client that reconnects is. DPDK
    /// forbids burst calls on a port that is stopping, stopped or starting.
    DetachPort(usize, Sender<()>),
    /// Use a port detached by [`Command::DetachPort`] again.
    AttachPort(usize),
    /// A command for the handler.
    Handler(C),
}

/// What the handler sees of the lcore: time, its ports' queues, its tx bursts and counters.
#[derive(Debug)]
pub struct Io<'a, Q: PortQueue> {
    /// The loop's time for this iteration.
    pub now: Instant,
    queues: &'a mut [Q],
    tx: &'a mut [Burst<Q::Buf>],
    /// This lcore's counters.
    pub counters: &'a LcoreCounters,
    /// Ports the worker has detached from ([`Command::Detach`], [`Command::DetachPort`]), one
    /// bit each: nothing is sent on them.
    off: u64,
}

impl<'a, Q: PortQueue> Io<'a, Q> {
    /// Number of ports.
    pub fn ports(&self) -> usize {
        self.queues.len()
    }

    /// A port's description.
    pub fn info(&self, port: usize) -> &PortInfo {
        self.queues[port].info()
    }

    /// A fresh buffer from `port`'s pool (counted as a drop when none is free).
    pub fn alloc(&mut self, port: usize) -> Option<Q::Buf> {
        let b = self.queues[port].alloc();
        if b.is_none() {
            self.counters.count_drop(DropReason::NoBuffer, 1);
        }
        b
    }

    /// Queues a frame for transmission on `port`; a full burst is flushed first, and if the
    /// port still takes none of it the frame is dropped (and counted). Senders that can wait
    /// ask [`Io::can_send`] first.
    #[inline]
    pub fn send(&mut self, port: usize, buf: Q::Buf) {
        if is_off(self.off, port) {
            self.drop_frame(off_reason(self.off), buf);
            return;
        }
        if self.tx[port].is_full() {
            flush(&mut self.queues[port], &mut self.tx[port], self.counters);
            if self.tx[port].is_full() {
                self.drop_frame(DropReason::TxFull, buf);
                return;
            }
        }
        self.tx[port].push(buf);
    }

    /// True when [`Io::send`] on `port` will queue a frame rather than drop it: there is room
    /// in the port's burst, after flushing it if it was full. Frames the port refuses wait in
    /// the burst for the next flush, so a sender that stops here when the port is busy loses
    /// nothing (backpressure instead of drops).
    #[inline]
    pub fn can_send(&mut self, port: usize) -> bool {
        if is_off(self.off, port) {
            return false;
        }
        if self.tx[port].is_full() {
            flush(&mut self.queues[port], &mut self.tx[port], self.counters);
        }
        !self.tx[port].is_full()
    }

    /// Transmits a whole burst on `port` now, after anything already queued there, leaving
    /// `burst` empty (what the port refuses is dropped and counted). No frame is moved.
    #[inline]
    pub fn transmit(&mut self, port: usize, burst: &mut Burst<Q::Buf>) {
        if is_off(self.off, port) {
            discard(burst, off_reason(self.off), self.counters);
            return;
        }
        if !self.tx[port].is_empty() {
            flush(&mut self.queues[port], &mut self.tx[port], self.counters);
        }
        flush(&mut self.queues[port], burst, self.counters);
        if !burst.is_empty() {
            self.counters
                .count_drop(DropReason::TxFull, burst.len() as u64);
            burst.clear();
        }
    }

    /// Drops a frame, counting why.
    #[inline]
    pub fn drop_frame(&self, reason: DropReason, buf: Q::Buf) {
        self.counters.count_drop(reason, 1);
        drop(buf);
    }
}

/// Whether `port`'s bit is set in a mask of detached ports.
#[inline]
fn is_off(off: u64, port: usize) -> bool {
    // Most of the time no port is off: one test, as the single flag this replaced.
    off != 0 && port < MAX_PORTS && off >> port & 1 != 0
}

/// Why a frame for a detached port is dropped: the worker is stopping (detached from every
/// port), or the port alone is left alone for a while.
#[inline]
fn off_reason(off: u64) -> DropReason {
    if off == u64::MAX {
        DropReason::Shutdown
    } else {
        DropReason::PortDetached
    }
}

/// Drops every frame of a burst that will never be sent (the worker stops or has detached),
/// counting them as `why`.
fn discard<B: PacketBuf>(burst: &mut Burst<B>, why: DropReason, c: &LcoreCounters) {
    c.count_drop(why, burst.len() as u64);
    burst.clear();
}

/// Transmits a burst; frames the port refused stay in it, in order, for the next flush.
fn flush<Q: PortQueue>(q: &mut Q, tx: &mut Burst<Q::Buf>, c: &LcoreCounters) -> usize {
    if tx.is_empty() {
        return 0;
    }
    let total: usize = tx.iter().map(|b| b.frame_len()).sum();
    let n = q.tx_burst(tx);
    let left: usize = tx.iter().map(|b| b.frame_len()).sum();
    c.tx_packets.add(n as u64);
    c.tx_bytes.add((total - left) as u64);
    n
}

/// What a worker does with the frames it receives.
pub trait Handler<Q: PortQueue>: Send {
    /// Commands the control thread can send it.
    type Command: Send;

    /// Whether the handler has timers: if not, the loop neither reads the clock nor calls
    /// [`Handler::on_poll`].
    const HAS_TIMERS: bool = true;

    /// Handles a received burst from `port`; it must take every frame out of `burst`.
    fn on_burst(&mut self, port: usize, burst: &mut Burst<Q::Buf>, io: &mut Io<'_, Q>);

    /// Runs timers; called every iteration, so it must return fast when nothing is due.
    fn on_poll(&mut self, _io: &mut Io<'_, Q>) {}

    /// Handles a command.
    fn on_command(&mut self, _cmd: Self::Command, _io: &mut Io<'_, Q>) {}

    /// Drops everything the handler holds; called once before the worker returns.
    fn shutdown(&mut self) {}
}

/// One worker lcore's state.
#[derive(Debug)]
pub struct Worker<Q: PortQueue, H: Handler<Q>, K> {
    /// Which worker this is.
    pub id: LcoreId,
    queues: Vec<Q>,
    tx: Vec<Burst<Q::Buf>>,
    handler: H,
    clock: K,
    counters: Arc<LcoreCounters>,
    commands: Receiver<Command<H::Command>>,
    since_commands: u32,
    /// Consecutive iterations that found nothing to do.
    idle_streak: u32,
    /// Sleep this long once idle for [`IDLE_SPINS`] iterations (None: always spin).
    idle_sleep: Option<core::time::Duration>,
    /// Ports it makes no more bursts on, one bit each ([`Command::Detach`],
    /// [`Command::DetachPort`]).
    off: u64,
}

/// Ports a worker can have: one bit each in its mask of detached ports (DPDK's build here has
/// `RTE_MAX_ETHPORTS` 32).
pub const MAX_PORTS: usize = 64;

/// Idle iterations before a worker with an idle sleep set sleeps.
pub const IDLE_SPINS: u32 = 256;

impl<Q, H, K> Worker<Q, H, K>
where
    Q: PortQueue,
    H: Handler<Q>,
    K: Clock,
    H::Command: core::fmt::Debug,
{
    /// A worker over `queues` (one per port, in port order, [`MAX_PORTS`] at most: the rest
    /// are never polled).
    pub fn new(
        id: LcoreId,
        queues: Vec<Q>,
        handler: H,
        clock: K,
        counters: Arc<LcoreCounters>,
        commands: Receiver<Command<H::Command>>,
    ) -> Self {
        let tx = queues.iter().map(|_| Burst::new()).collect();
        Worker {
            id,
            queues,
            tx,
            handler,
            clock,
            counters,
            commands,
            since_commands: 0,
            idle_streak: 0,
            idle_sleep: None,
            off: 0,
        }
    }

    /// Starts the worker detached from the ports whose bits `off` sets, as if it had been
    /// sent [`Command::DetachPort`] for each (ports that did not start).
    pub fn with_ports_detached(mut self, off: u64) -> Self {
        self.off = off;
        self
    }

    /// Makes the worker sleep for `d` whenever it has found nothing to do for [`IDLE_SPINS`]
    /// iterations in a row, instead of spinning: for lcores that share CPUs with other work
    /// (several nodes on one small machine, tests), at the price of up to `d` more latency
    /// for the first frame after a quiet spell. Dedicated cores should spin (the default).
    pub fn with_idle_sleep(mut self, d: Option<core::time::Duration>) -> Self {
        self.idle_sleep = d.filter(|d| !d.is_zero());
        self
    }

    /// Runs the loop until [`Command::Stop`] arrives or the command channel closes, then drops
    /// every frame it holds and returns the queues (so the caller can stop ports after workers).
    pub fn run(mut self) -> Vec<Q> {
        let mut rx: Burst<Q::Buf> = Burst::new();
        while self.poll_once(&mut rx) {
            if let Some(d) = self.idle_sleep
                && self.idle_streak >= IDLE_SPINS
            {
                std::thread::sleep(d);
            }
        }
        self.finish()
    }

    /// One iteration of the loop: receive and dispatch a burst from each port, run timers,
    /// transmit, and (every [`COMMAND_POLL_INTERVAL`] iterations or when idle) take commands.
    /// Returns false once the worker must stop. `rx` is scratch space, empty between calls.
    #[inline]
    pub fn poll_once(&mut self, rx: &mut Burst<Q::Buf>) -> bool {
        let now = if H::HAS_TIMERS {
            self.clock.now()
        } else {
            Instant::ZERO
        };
        let mut work = 0usize;
        let ports = self.queues.len().min(MAX_PORTS);
        for port in 0..ports {
            if is_off(self.off, port) {
                continue;
            }
            // Several bursts while they come back full: a sender with many QPs queues a port's
            // worth of frames per iteration, and their ACKs must drain as fast (one burst
            // per iteration let 100k QPs' ACKs wait past the ACK timeout).
            for _ in 0..RX_BURSTS_PER_POLL {
                let n = self.receive(port, now, rx);
                work += n;
                if n < crate::BURST_SIZE {
                    break;
                }
            }
        }
        if H::HAS_TIMERS {
            let mut io = Io {
                now,
                queues: &mut self.queues,
                tx: &mut self.tx,
                counters: &self.counters,
                off: self.off,
            };
            self.handler.on_poll(&mut io);
        }
        // Commands are taken before transmitting, so what they send leaves in this iteration:
        // every COMMAND_POLL_INTERVAL iterations while busy, every IDLE_COMMAND_POLL_INTERVAL
        // while idle, and before every idle sleep.
        self.since_commands += 1;
        let mut keep_going = true;
        if self.since_commands >= COMMAND_POLL_INTERVAL
            || work == 0 && self.since_commands >= IDLE_COMMAND_POLL_INTERVAL
            || work == 0 && self.idle_sleep.is_some() && self.idle_streak >= IDLE_SPINS
        {
            self.since_commands = 0;
            keep_going = self.poll_commands();
        }
        for port in 0..ports {
            if !is_off(self.off, port) {
                work += flush(&mut self.queues[port], &mut self.tx[port], &self.counters);
            }
        }
        if work == 0 {
            self.counters.idle_loops.inc();
            self.idle_streak = self.idle_streak.saturating_add(1);
        } else {
            self.counters.busy_loops.inc();
            self.idle_streak = 0;
        }
        keep_going
    }

    /// Receives one burst from `port` and hands it to the handler; returns how many frames.
    #[inline]
    fn receive(&mut self, port: usize, now: Instant, rx: &mut Burst<Q::Buf>) -> usize {
        let n = self.queues[port].rx_burst(rx);
        if n == 0 {
            return 0;
        }
        self.counters.rx_packets.add(n as u64);
        self.counters
            .rx_bytes
            .add(rx.iter().map(|b| b.len() as u64).sum());
        let mut io = Io {
            now,
            queues: &mut self.queues,
            tx: &mut self.tx,
            counters: &self.counters,
            off: self.off,
        };
        self.handler.on_burst(port, rx, &mut io);
        debug_assert!(rx.is_empty(), "handler left frames in the rx burst");
        rx.clear();
        // Most frames leave by the port they came in on: send them now, as testpmd does.
        flush(&mut self.queues[port], &mut self.tx[port], &self.counters);
        n
    }

    /// Drops everything the handler and the tx bursts hold, and returns the queues.
    pub fn finish(mut self) -> Vec<Q> {
        self.handler.shutdown();
        for tx in &mut self.tx {
            discard(tx, DropReason::Shutdown, &self.counters);
        }
        self.queues
    }

    /// The handler (for tests and inspection between iterations).
    pub fn handler(&self) -> &H {
        &self.handler
    }

    /// Takes pending commands; false when the loop must stop.
    fn poll_commands(&mut self) -> bool {
        let counters = &*self.counters;
        loop {
            match self.commands.try_recv() {
                Ok(Command::Stop) => return false,
                Ok(Command::Detach(done)) => {
                    self.off = u64::MAX;
                    for tx in &mut self.tx {
                        discard(tx, DropReason::Shutdown, counters);
                    }
                    let _ = done.send(());
                }
                Ok(Command::DetachPort(port, done)) => {
                    if port < MAX_PORTS {
                        self.off |= 1 << port;
                    }
                    if let Some(tx) = self.tx.get_mut(port) {
                        discard(tx, DropReason::PortDetached, counters);
                    }
                    let _ = done.send(());
                }
                Ok(Command::AttachPort(port)) => {
                    if port < MAX_PORTS {
                        self.off &= !(1 << port);
                    }
                }
                Ok(Command::Handler(c)) => {
                    counters.commands.inc();
                    let mut io = Io {
                        now: self.clock.now(),
                        queues: &mut self.queues,
                        tx: &mut self.tx,
                        counters,
                        off: self.off,
                    };
                    self.handler.on_command(c, &mut io);
                }
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }
}

/// The benchmark handler: swaps source and destination MAC and sends the frame back out of the
/// port it came in on, as dpdk-testpmd's `macswap` forwarding mode does.
#[derive(Debug, Default)]
pub struct MacSwap;

impl<Q: PortQueue> Handler<Q> for MacSwap {
    type Command = ();
    const HAS_TIMERS: bool = false;

    #[inline]
    fn on_burst(&mut self, port: usize, burst: &mut Burst<Q::Buf>, io: &mut Io<'_, Q>) {
        // One pass; a runt (never seen on a sane link) sends the burst down the slow path.
        let mut runt = false;
        let n = burst.len();
        for i in 0..n {
            if i + 1 < n {
                prefetch(burst[i + 1].data().as_ptr());
            }
            let d = burst[i].data_mut();
            if d.len() >= 12 {
                swap_macs(d);
            } else {
                runt = true;
            }
        }
        if !runt {
            io.transmit(port, burst);
            return;
        }
        for b in burst.drain(..) {
            if b.len() >= 12 {
                io.send(port, b);
            } else {
                io.drop_frame(DropReason::Malformed, b);
            }
        }
    }
}

/// Swaps the destination and source MAC with two loads and two stores.
#[inline(always)]
fn swap_macs(d: &mut [u8]) {
    let (head, _) = d.split_at_mut(12);
    let a = u64::from_le_bytes(head[0..8].try_into().expect("8 bytes"));
    let b = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    // Little-endian: bytes 0-5 of `a` are the destination, bytes 6-7 of `a` and 0-3 of `b`
    // the source.
    let new_a = (a >> 48) | ((b as u64) << 16) | (a << 48);
    let new_b = (a >> 16) as u32;
    head[0..8].copy_from_slice(&new_a.to_le_bytes());
    head[8..12].copy_from_slice(&new_b.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::mem::link;

    use crossbeam_channel::unbounded;
    use std::time::Duration;

    fn info(i: u16) -> PortInfo {
        PortInfo::virtual_port(i, 1500)
    }

    type Spawned = (
        crossbeam_channel::Sender<Command<()>>,
        Arc<LcoreCounters>,
        crate::port::mem::MemQueue,
        std::thread::JoinHandle<Vec<crate::port::mem::MemQueue>>,
    );

    /// A worker running `handler` on a thread over one in-memory link: its command channel,
    /// counters, the link's far end and the thread.
    fn spawn_worker<H>(handler: H) -> Spawned
    where
        H: Handler<crate::port::mem::MemQueue, Command = ()> + 'static,
    {
        let (dut, host) = link(info(0), info(1), 64);
        let (tx, rx) = unbounded();
        let counters = Arc::new(LcoreCounters::default());
        let w = Worker::new(
            LcoreId(0),
            vec![dut],
            handler,
            StdClock::new(),
            counters.clone(),
            rx,
        );
        (tx, counters, host, std::thread::spawn(move || w.run()))
    }

    #[test]
    fn swap_macs_swaps_exactly_the_two_addresses() {
        let mut f: Vec<u8> = (0..20).collect();
        swap_macs(&mut f);
        assert_eq!(&f[..12], &[6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5]);
        assert_eq!(&f[12..], &(12..20).collect::<Vec<u8>>()[..]);
    }

    #[test]
    fn macswap_worker_reflects_frames_and_stops_on_command() {
        let (tx, counters, mut host, t) = spawn_worker(MacSwap);
        let mut frame = [0u8; 60];
        frame[0..6].copy_from_slice(&[1; 6]);
        frame[6..12].copy_from_slice(&[2; 6]);
        for _ in 0..10 {
            assert!(host.send_frame(&frame));
        }
        for _ in 0..10 {
            let got = host
                .recv_frame_timeout(Duration::from_secs(5))
                .expect("reflected frame");
            assert_eq!(&got[0..6], &[2; 6]);
            assert_eq!(&got[6..12], &[1; 6]);
        }
        tx.send(Command::Stop).unwrap();
        let queues = t.join().unwrap();
        assert_eq!(queues.len(), 1);
        assert_eq!(counters.rx_packets.get(), 10);
        assert_eq!(counters.tx_packets.get(), 10);
        assert_eq!(counters.tx_bytes.get(), 600);
    }

    /// Sends one 60-byte frame on every port per command, and reflects nothing.
    struct SendOnCommand;

    impl<Q: PortQueue> Handler<Q> for SendOnCommand {
        type Command = ();

        fn on_burst(&mut self, _port: usize, burst: &mut Burst<Q::Buf>, _io: &mut Io<'_, Q>) {
            burst.clear();
        }

        fn on_command(&mut self, _cmd: (), io: &mut Io<'_, Q>) {
            for port in 0..io.ports() {
                if let Some(mut b) = io.alloc(port) {
                    b.append(60).expect("room for 60 bytes");
                    io.send(port, b);
                }
            }
        }
    }

    #[test]
    fn a_detached_worker_neither_receives_nor_sends_but_still_takes_commands() {
        let (tx, counters, mut host, t) = spawn_worker(SendOnCommand);
        // Attached: a command's frame goes out, a frame sent in is received.
        tx.send(Command::Handler(())).unwrap();
        assert!(host.recv_frame_timeout(Duration::from_secs(5)).is_some());
        assert!(host.send_frame(&[0u8; 60]));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while counters.rx_packets.get() < 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(counters.rx_packets.get(), 1);
        // Detached: the answer comes, then nothing moves on the port either way.
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        tx.send(Command::Detach(done_tx)).unwrap();
        done_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("detach answered");
        for _ in 0..3 {
            tx.send(Command::Handler(())).unwrap();
            assert!(host.send_frame(&[0u8; 60]));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while counters.commands.get() < 4 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(counters.commands.get(), 4, "commands are still taken");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(host.recv_frame(), None, "nothing sent after detaching");
        assert_eq!(counters.drops(DropReason::Shutdown), 3);
        assert_eq!(
            counters.rx_packets.get(),
            1,
            "nothing received after detaching"
        );
        assert_eq!(counters.tx_packets.get(), 1);
        tx.send(Command::Stop).unwrap();
        assert_eq!(t.join().unwrap().len(), 1);
    }

    #[test]
    fn a_port_detached_alone_is_left_alone_until_attached_again_while_the_others_work() {
        let (dut0, mut host0) = link(info(0), info(1), 64);
        let (dut1, mut host1) = link(info(2), info(3), 64);
        let (tx, rx) = unbounded();
        let counters = Arc::new(LcoreCounters::default());
        let w = Worker::new(
            LcoreId(0),
            vec![dut0, dut1],
            SendOnCommand,
            StdClock::new(),
            counters.clone(),
            rx,
        );
        let t = std::thread::spawn(move || w.run());
        let wait_for = |what: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !what() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        tx.send(Command::Handler(())).unwrap();
        assert!(host0.recv_frame_timeout(Duration::from_secs(5)).is_some());
        assert!(host1.recv_frame_timeout(Duration::from_secs(5)).is_some());
        // Port 0 detached: nothing goes out of it or is taken from it; port 1 carries on.
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        tx.send(Command::DetachPort(0, done_tx)).unwrap();
        done_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("detach answered");
        assert!(host0.send_frame(&[0u8; 60]));
        assert!(host1.send_frame(&[0u8; 60]));
        tx.send(Command::Handler(())).unwrap();
        assert!(host1.recv_frame_timeout(Duration::from_secs(5)).is_some());
        wait_for(&|| counters.rx_packets.get() >= 1);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            host0.recv_frame(),
            None,
            "nothing sent on the detached port"
        );
        assert_eq!(counters.rx_packets.get(), 1, "only port 1's frame taken");
        assert_eq!(counters.drops(DropReason::PortDetached), 1);
        assert_eq!(counters.drops(DropReason::Shutdown), 0);
        // Attached again: the frame that waited in port 0's ring is taken, and it sends.
        tx.send(Command::AttachPort(0)).unwrap();
        tx.send(Command::Handler(())).unwrap();
        assert!(host0.recv_frame_timeout(Duration::from_secs(5)).is_some());
        assert!(host1.recv_frame_timeout(Duration::from_secs(5)).is_some());
        wait_for(&|| counters.rx_packets.get() >= 2);
        assert_eq!(counters.rx_packets.get(), 2);
        assert_eq!(counters.tx_packets.get(), 5);
        tx.send(Command::Stop).unwrap();
        assert_eq!(t.join().unwrap().len(), 2);
    }
}
