//! perftest on the device: bandwidth streams ([`stream`]) and latency tests ([`latency`])
//! that run beside the QPs, posting and counting without a control round trip per message.
//!
//! A test claims its QP's completions ([`Claim`]): they stay in the QP's own queues and the
//! device raises an [`Event`] whenever the QP changes. [`Tests::handle_events`] takes those
//! events and drives the tests they name (post more, count, answer when done); the caller
//! runs it after the frames of each loop iteration and after each verbs call, and
//! [`Tests::poll`] once per iteration for what runs by the clock or by polling memory (timed
//! receive streams, WRITE latency). A test answers through the [`Reply`] it was started with.

pub mod latency;
pub mod stream;

use crate::device::{Claim, Device, Event};
use crate::qp::QpState;
use crate::wr::{RecvWr, SendWr};
use latency::Lat;
pub use latency::{LatKind, LatResult, LatSample};
pub use stream::{RECV_DRAIN, Shape, StreamResult};
use stream::{RecvStream, Stream, StreamReply};
use wire::time::Instant;

/// How a test answers its caller, once (on the thread that drives the device).
pub type Reply<T> = Box<dyn FnOnce(Result<T, TestError>) + Send>;

/// Why a test could not start, or why a several-QP run failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TestError {
    /// No such QP on this shard.
    #[error("no QP {0:#x} on this lcore")]
    NoQp(u32),
    /// The QP already runs a send stream.
    #[error("QP {0} is already streaming")]
    Streaming(u32),
    /// The QP is not in RTS.
    #[error("QP {0} is not in RTS")]
    NotRts(u32),
    /// The QP already runs a receive stream or latency test.
    #[error("QP {0} is already receiving a test")]
    Receiving(u32),
    /// The QP is neither in RTR nor RTS.
    #[error("QP {0} is not connected")]
    NotConnected(u32),
    /// The QP already runs a test.
    #[error("QP {0} is already running a test")]
    Running(u32),
    /// An iteration count out of range.
    #[error("iterations are 1 to 16777216")]
    Iterations,
    /// A timed test of no time.
    #[error("a timed test needs a duration above 0")]
    ZeroDuration,
    /// A several-QP run of none.
    #[error("no QPs")]
    NoQps,
    /// A QP of a several-QP run cannot take part.
    #[error("QP {qpn} is not here, {why}")]
    Member {
        /// The QP.
        qpn: u32,
        /// Why.
        why: &'static str,
    },
    /// A member of a several-QP run was destroyed during the run.
    #[error("QP {qpn} was destroyed during the run ({completed} completed)")]
    Destroyed {
        /// The QP.
        qpn: u32,
        /// What the run had completed by its end.
        completed: u64,
    },
}

/// The tests on one QP.
#[derive(Default)]
struct Run {
    stream: Option<Stream>,
    rstream: Option<RecvStream>,
    lat: Option<Lat>,
}

impl Run {
    /// The completions its tests take (a receive stream or latency test takes both sides).
    fn claim(&self) -> Claim {
        let both = self.rstream.is_some() || self.lat.is_some();
        Claim {
            send: both || self.stream.is_some(),
            recv: both,
        }
    }

    fn is_empty(&self) -> bool {
        self.stream.is_none() && self.rstream.is_none() && self.lat.is_none()
    }
}

/// A member of a several-QP run that finished: the run, its result, and the span it counts.
type MemberEnd = (usize, StreamResult, Option<Instant>, Instant);

/// A several-QP run: its streams report here; the last one to finish replies.
struct StreamGroup {
    remaining: usize,
    completed: u64,
    errors: u64,
    started: Instant,
    /// The first arrival on any member (receive streams), from which its time runs.
    first: Option<Instant>,
    reply: Reply<StreamResult>,
}

/// The tests running on one device shard.
#[derive(Default)]
pub struct Tests {
    /// By device slot.
    runs: Vec<Run>,
    /// Slots running a latency test (their peer's WRITEs are seen by polling memory).
    lats: Vec<u32>,
    /// Slots running a timed receive stream (which ends by the clock, arrivals or not).
    timed_recv: Vec<u32>,
    /// Several-QP runs in progress.
    groups: Vec<Option<StreamGroup>>,
    /// Scratch for polling completions (allocated once).
    wcs: Vec<crate::cq::WorkCompletion>,
}

impl core::fmt::Debug for Tests {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Tests")
            .field(
                "running",
                &self.runs.iter().filter(|r| !r.is_empty()).count(),
            )
            .finish()
    }
}

impl Tests {
    fn run_mut(&mut self, i: usize) -> &mut Run {
        if self.runs.len() <= i {
            self.runs.resize_with(i + 1, Run::default);
        }
        &mut self.runs[i]
    }

    /// Drives the tests the device's pending events name.
    #[inline]
    pub fn handle_events(&mut self, dev: &mut Device, now: Instant) {
        while let Some(e) = dev.poll_event() {
            self.handle_event(dev, e, now);
        }
    }

    /// Drives the test an event of the device names (if a test has that QP).
    #[inline]
    pub fn handle_event(&mut self, dev: &mut Device, e: Event, now: Instant) {
        match e {
            Event::Activity { slot } => self.drive(dev, slot as usize, now),
            Event::Destroyed { slot, qpn } => self.destroyed(slot as usize, qpn),
        }
    }

    /// What runs by the clock or by polling memory: latency tests and timed receive
    /// streams. Once per loop iteration.
    pub fn poll(&mut self, dev: &mut Device, now: Instant) {
        for k in (0..self.lats.len()).rev() {
            if let Some(&i) = self.lats.get(k) {
                self.drive(dev, i as usize, now);
            }
        }
        for k in (0..self.timed_recv.len()).rev() {
            if let Some(&i) = self.timed_recv.get(k) {
                self.drive(dev, i as usize, now);
            }
        }
    }

    /// Lets the tests of slot `i` see what its QP did (post more, count, answer when done).
    fn drive(&mut self, dev: &mut Device, i: usize, now: Instant) {
        // No test on the slot: its QP is someone else's (an application's: its claim is not
        // the tests' to drop, as setting the empty run's claim below once did, after a test
        // on a higher slot had grown the table past it).
        let Some(run) = self.runs.get_mut(i).filter(|r| !r.is_empty()) else {
            return;
        };
        let Some((slot, mrs)) = dev.slot_mut(i) else {
            return;
        };
        let mut posted = false;
        let mut ended: [Option<MemberEnd>; 2] = [None; 2];
        if let Some(st) = run.stream.as_mut() {
            let (p, end) = st.feed(&mut slot.qp, &mut slot.scq, mrs, now);
            posted |= p;
            if let Some(r) = end {
                match run.stream.take().expect("stream present").reply {
                    StreamReply::One(reply) => reply(Ok(r)),
                    StreamReply::Group(g) => ended[0] = Some((g, r, None, now)),
                }
            }
        }
        if let Some(st) = run.rstream.as_mut()
            && let Some(end) = st.feed(&mut slot.qp, &mut slot.rcq, &mut self.wcs, now)
        {
            let st = run.rstream.take().expect("receive stream present");
            if st.window_ns.is_some() {
                self.timed_recv.retain(|&x| x as usize != i);
            }
            match st.reply {
                StreamReply::One(reply) => reply(Ok(end.result)),
                StreamReply::Group(g) => ended[1] = Some((g, end.result, end.span.0, end.span.1)),
            }
        }
        if let Some(t) = run.lat.as_mut() {
            let (p, end) = t.drive(
                &mut slot.qp,
                [&mut slot.scq, &mut slot.rcq],
                mrs,
                &mut self.wcs,
                now,
            );
            posted |= p;
            if let Some(r) = end {
                (run.lat.take().expect("latency test present").reply)(Ok(r));
                self.lats.retain(|&x| x as usize != i);
            }
        }
        let claim = run.claim();
        dev.claim(i, claim);
        if posted {
            dev.mark_ready(i);
        }
        dev.settle(i);
        for (g, r, first, end) in ended.into_iter().flatten() {
            self.member_done(g, r, first, end);
        }
    }

    /// The QP in slot `i` was destroyed: its tests end; a several-QP run counts what it had
    /// not done as errors and ends when the others do.
    fn destroyed(&mut self, i: usize, qpn: u32) {
        let Some(run) = self.runs.get_mut(i) else {
            return;
        };
        let run = core::mem::take(run);
        self.lats.retain(|&x| x as usize != i);
        self.timed_recv.retain(|&x| x as usize != i);
        // A test of one QP answers nothing: its caller sees the reply dropped.
        let lost = match (run.stream, run.rstream) {
            (Some(st), _) => match st.reply {
                StreamReply::Group(g) => Some((g, st.done, st.undone())),
                StreamReply::One(_) => None,
            },
            (None, Some(rs)) => match rs.reply {
                StreamReply::Group(g) => Some((g, rs.done, rs.undone())),
                StreamReply::One(_) => None,
            },
            (None, None) => None,
        };
        if let Some((g, done, undone)) = lost
            && let Some(grp) = self.groups.get_mut(g).and_then(Option::as_mut)
        {
            grp.completed += done;
            grp.errors = grp.errors.saturating_add(undone);
            grp.remaining -= 1;
            if grp.remaining == 0 {
                let grp = self.groups[g].take().expect("group present");
                (grp.reply)(Err(TestError::Destroyed {
                    qpn,
                    completed: grp.completed,
                }));
            }
        }
    }

    /// A member of several-QP run `g` finished with `r` (`first`: its first arrival, for
    /// receive streams); the last one replies for the group.
    fn member_done(&mut self, g: usize, r: StreamResult, first: Option<Instant>, now: Instant) {
        let Some(grp) = self.groups.get_mut(g).and_then(Option::as_mut) else {
            return;
        };
        grp.completed += r.completed;
        grp.errors = grp.errors.saturating_add(r.errors);
        grp.first = match (grp.first, first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        grp.remaining -= 1;
        if grp.remaining == 0 {
            let grp = self.groups[g].take().expect("group present");
            let elapsed = now.0.saturating_sub(grp.first.unwrap_or(grp.started).0);
            (grp.reply)(Ok(StreamResult {
                completed: grp.completed,
                errors: grp.errors,
                elapsed_ns: elapsed,
                // The group keeps no per-completion times: its average.
                best_ns_per_wr: elapsed as f64 / grp.completed.max(1) as f64,
            }));
        }
    }

    /// Starts a group run on `qpns` when every one is here and `can_start` (all of them or
    /// none): their slots and the group's index. Otherwise `reply` hears why (the first QP
    /// that cannot, or no QPs at all) and nothing starts.
    fn start_group(
        &mut self,
        dev: &Device,
        qpns: impl ExactSizeIterator<Item = u32>,
        can_start: impl Fn(&Run, QpState) -> bool,
        why: &'static str,
        now: Instant,
        reply: Reply<StreamResult>,
    ) -> Option<(Vec<usize>, usize)> {
        let mut slots = Vec::with_capacity(qpns.len());
        for qpn in qpns {
            let ok = dev.index(qpn).filter(|&i| {
                let empty = Run::default();
                let run = self.runs.get(i).unwrap_or(&empty);
                dev.state(i).is_some_and(|st| can_start(run, st))
            });
            match ok {
                Some(i) => slots.push(i),
                None => {
                    reply(Err(TestError::Member { qpn, why }));
                    return None;
                }
            }
        }
        if slots.is_empty() {
            reply(Err(TestError::NoQps));
            return None;
        }
        let g = match self.groups.iter().position(Option::is_none) {
            Some(g) => g,
            None => {
                self.groups.push(None);
                self.groups.len() - 1
            }
        };
        self.groups[g] = Some(StreamGroup {
            remaining: slots.len(),
            completed: 0,
            errors: 0,
            started: now,
            first: None,
            reply,
        });
        Some((slots, g))
    }

    /// Posts `count` copies of `wr` (wr_id counting down from its own + count), keeping
    /// `depth` outstanding, posting for `duration` at most (perftest's -D); answers when all
    /// have completed. The QP's send completions go to the stream meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub fn stream(
        &mut self,
        dev: &mut Device,
        now: Instant,
        qpn: u32,
        wr: SendWr,
        shape: impl Into<Shape>,
        reply: Reply<StreamResult>,
    ) {
        let Some(i) = dev.index(qpn) else {
            return reply(Err(TestError::NoQp(qpn)));
        };
        let run = self.run_mut(i);
        if run.stream.is_some() {
            return reply(Err(TestError::Streaming(qpn)));
        }
        if dev.state(i) != Some(QpState::Rts) {
            return reply(Err(TestError::NotRts(qpn)));
        }
        run.stream = Some(Stream::new(wr, shape.into(), now, StreamReply::One(reply)));
        self.drive(dev, i, now);
    }

    /// Streams on several QPs at once (a perftest run with several QPs): each QP posts
    /// `count` copies of its own request, `depth` outstanding; answers once all are done,
    /// with their sum and the time from the start to the last completion.
    pub fn streams(
        &mut self,
        dev: &mut Device,
        now: Instant,
        qps: Vec<(u32, SendWr)>,
        shape: impl Into<Shape>,
        reply: Reply<StreamResult>,
    ) {
        let shape = shape.into();
        let Some((slots, g)) = self.start_group(
            dev,
            qps.iter().map(|q| q.0),
            |r, st| r.stream.is_none() && st == QpState::Rts,
            "not in RTS or already streaming",
            now,
            reply,
        ) else {
            return;
        };
        for (&i, (_, wr)) in slots.iter().zip(qps) {
            self.run_mut(i).stream = Some(Stream::new(wr, shape, now, StreamReply::Group(g)));
        }
        for i in slots {
            self.drive(dev, i, now);
        }
    }

    /// Receives `count` messages (perftest's SEND bandwidth server): `posted` receives of
    /// `recv` are already posted, and each completed one is reposted while more are needed;
    /// answers when all have arrived. The QP's completions go to the stream meanwhile. With
    /// a `duration` (perftest's -D) `count` is ignored and the stream keeps time as
    /// perftest's SEND server does: from the first arrival it waits a margin (a quarter of
    /// the whole seconds of `duration`), counts what arrives for `duration`, keeps reposting
    /// for the margin and [`RECV_DRAIN`] more (so the sender's last messages find
    /// receives), then answers.
    #[allow(clippy::too_many_arguments)]
    pub fn recv_stream(
        &mut self,
        dev: &mut Device,
        now: Instant,
        qpn: u32,
        recv: RecvWr,
        (count, posted, duration): (u64, u64, Option<core::time::Duration>),
        reply: Reply<StreamResult>,
    ) {
        let Some(i) = dev.index(qpn) else {
            return reply(Err(TestError::NoQp(qpn)));
        };
        let run = self.run_mut(i);
        if run.rstream.is_some() || run.lat.is_some() {
            return reply(Err(TestError::Receiving(qpn)));
        }
        if !matches!(dev.state(i), Some(QpState::Rtr | QpState::Rts)) {
            return reply(Err(TestError::NotConnected(qpn)));
        }
        run.rstream = Some(RecvStream::new(
            recv,
            count,
            posted,
            duration,
            StreamReply::One(reply),
        ));
        if duration.is_some() {
            self.timed_recv.push(i as u32);
        }
        self.drive(dev, i, now);
    }

    /// [`Tests::recv_stream`] on several QPs at once (a SEND bandwidth server with several
    /// QPs): `count` messages and `posted` receives each; one answer, the sum, from the
    /// first arrival on any of them to the last.
    pub fn recv_streams(
        &mut self,
        dev: &mut Device,
        now: Instant,
        qpns: Vec<u32>,
        recv: RecvWr,
        (count, posted, duration): (u64, u64, Option<core::time::Duration>),
        reply: Reply<StreamResult>,
    ) {
        let Some((slots, g)) = self.start_group(
            dev,
            qpns.iter().copied(),
            |r, st| {
                let connected = matches!(st, QpState::Rtr | QpState::Rts);
                r.rstream.is_none() && r.lat.is_none() && connected
            },
            "not connected or already receiving a test",
            now,
            reply,
        ) else {
            return;
        };
        for &i in &slots {
            self.run_mut(i).rstream = Some(RecvStream::new(
                recv,
                count,
                posted,
                duration,
                StreamReply::Group(g),
            ));
            if duration.is_some() {
                self.timed_recv.push(i as u32);
            }
        }
        for i in slots {
            self.drive(dev, i, now);
        }
    }

    /// Runs one of perftest's latency tests (`kind`, each iteration posting `wr`; `server`:
    /// this side is perftest's server, which matters for who goes first) on a connected QP;
    /// answers when it is done. The QP's completions go to the test meanwhile. With a
    /// `duration` (perftest's -D) `iters` is ignored: the test runs that long and keeps time
    /// as perftest does ([`LatSample`]).
    #[allow(clippy::too_many_arguments)]
    pub fn latency(
        &mut self,
        dev: &mut Device,
        now: Instant,
        qpn: u32,
        test: (LatKind, SendWr, bool),
        iters: u64,
        duration: Option<core::time::Duration>,
        reply: Reply<LatResult>,
    ) {
        let Some(i) = dev.index(qpn) else {
            return reply(Err(TestError::NoQp(qpn)));
        };
        let run = self.run_mut(i);
        if !run.is_empty() {
            return reply(Err(TestError::Running(qpn)));
        }
        if dev.state(i) != Some(QpState::Rts) {
            return reply(Err(TestError::NotRts(qpn)));
        }
        match Lat::new(test, iters, duration, now, reply) {
            Ok(t) => run.lat = Some(t),
            Err((e, reply)) => return reply(Err(e)),
        }
        self.lats.push(i as u32);
        self.drive(dev, i, now);
    }

    /// Ends the tests running on `qpns` now (their caller stopped waiting): as
    /// [`Tests::cancel`] does, but only for those QPs; how many it stopped (0: they had
    /// finished, and answered, already). QPs that are gone or run no test are left alone.
    pub fn cancel_qps(&mut self, dev: &mut Device, now: Instant, qpns: &[u32]) -> usize {
        qpns.iter()
            .filter(|&&q| dev.index(q).is_some_and(|i| self.stop(dev, i, now)))
            .count()
    }

    /// Ends every test now (the node is stopping): their QPs go to ERR, their work is
    /// flushed, and each test answers with what it had done; how many QPs it stopped.
    pub fn cancel(&mut self, dev: &mut Device, now: Instant) -> usize {
        (0..self.runs.len())
            .filter(|&i| self.stop(dev, i, now))
            .count()
    }

    /// Moves slot `i`'s QP to ERR if a test runs on it, and drives the test, which sees its
    /// work flushed and answers; whether there was one.
    fn stop(&mut self, dev: &mut Device, i: usize, now: Instant) -> bool {
        if self.runs.get(i).is_none_or(|r| r.is_empty()) {
            return false;
        }
        dev.fail(i);
        self.drive(dev, i, now);
        true
    }
}
