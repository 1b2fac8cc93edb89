//! perftest's latency tests (`run_iter_lat`, `run_iter_lat_write`, `run_iter_lat_send`), each
//! blocking point of perftest's loop a return that the next poll resumes.

use super::stream::post_copy;
use crate::cq::{WcOpcode, WcStatus, WorkCompletion};
use crate::mr::MrTable;
use crate::qp::QpState;
use crate::rc::RcQp;
use crate::wr::{RecvWr, SendWr};
use wire::time::Instant;

/// perftest's latency tests, as the lcore runs them.
#[derive(Clone, Debug)]
pub enum LatKind {
    /// READ or atomic (`run_iter_lat`): one request at a time, the next posted as the last
    /// completes.
    Request,
    /// WRITE ping-pong (`run_iter_lat_write`): each WRITE sets the message's last byte to the
    /// iteration number; a side posts its next WRITE once the peer's has set the byte at
    /// `poll` (key, address) to the count it expects. `mark` (key, address) is that byte in
    /// our source. The server posts first.
    Write {
        /// The byte the peer's WRITEs land on.
        poll: (u32, u64),
        /// The last byte of our source.
        mark: (u32, u64),
    },
    /// SEND ping-pong (`run_iter_lat_send`): each side sends when the peer's message has
    /// arrived; `rx_depth` receives of `recv` are already posted and are reposted as they
    /// complete. The client posts first.
    Send {
        /// The receive to repost.
        recv: RecvWr,
        /// Receives posted before the test.
        rx_depth: u64,
    },
}

/// What a latency test measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatResult {
    /// When each iteration's request was posted, nanoseconds of lcore time from the first
    /// (perftest's `tposted`): their differences are the round trips. Empty for a timed test.
    pub posted_ns: Vec<u64>,
    /// A timed test's sample (None for a test of so many iterations).
    pub sample: Option<LatSample>,
    /// Requests that completed in error (the test stops at the first).
    pub errors: u64,
    /// Why it stopped early: the first error completion's status and opcode, or what failed.
    pub failure: Option<String>,
    /// From the start to the end of the test, nanoseconds of lcore time.
    pub elapsed_ns: u64,
}

/// What a timed latency test (perftest's -D) counted. It keeps perftest's clock: a margin of
/// a quarter of the whole seconds, then the sample window (the duration less two margins),
/// then the margin again; completions within the window are the iterations, and the
/// window's length divided by them is the average round trip (perftest's `t_avg`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatSample {
    /// Requests that completed within the window.
    pub iters: u64,
    /// The window's length as the lcore clocked it, ns.
    pub window_ns: u64,
}

/// A timed latency test's clock (see [`LatSample`]), ns from its start.
#[derive(Clone, Copy, Debug)]
struct LatClock {
    margin_ns: u64,
    duration_ns: u64,
    opened: Option<Instant>,
    closed: Option<Instant>,
    iters: u64,
}

impl LatClock {
    fn new(d: core::time::Duration) -> Self {
        LatClock {
            // perftest: margin = duration / 4, in whole seconds.
            margin_ns: d.as_secs() / 4 * 1_000_000_000,
            duration_ns: d.as_nanos().min(u64::MAX as u128) as u64,
            opened: None,
            closed: None,
            iters: 0,
        }
    }

    /// Moves the window on to `since` ns after the start; true once the test is over.
    fn tick(&mut self, now: Instant, since: u64) -> bool {
        if self.opened.is_none() && since >= self.margin_ns {
            self.opened = Some(now);
        }
        if self.closed.is_none() && since >= self.duration_ns.saturating_sub(self.margin_ns) {
            self.closed = Some(now);
        }
        since >= self.duration_ns
    }

    /// Counts `n` completions seen now.
    fn completed(&mut self, n: u64) {
        if self.opened.is_some() && self.closed.is_none() {
            self.iters += n;
        }
    }

    fn sample(&self) -> LatSample {
        let window_ns = match (self.opened, self.closed) {
            (Some(o), Some(c)) => c.0.saturating_sub(o.0),
            _ => 0,
        };
        LatSample {
            iters: self.iters,
            window_ns,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LatStep {
    Wait,
    Post,
    Complete,
}

/// Where a latency test stands: perftest's loop (wait for the peer, post, count the
/// completion).
pub(super) struct Lat {
    kind: LatKind,
    wr: SendWr,
    iters: u64,
    server: bool,
    scnt: u64,
    rcnt: u64,
    ccnt: u64,
    /// Completions and receives taken from the CQs and not yet consumed by the loop.
    sends_done: u64,
    recvs_done: u64,
    /// Receives reposted so far (SEND).
    reposted: u64,
    step: LatStep,
    started: Instant,
    /// A timed test's clock (its `iters` is then unbounded).
    clock: Option<LatClock>,
    posted: Vec<u64>,
    errors: u64,
    failure: Option<String>,
    pub(super) reply: super::Reply<LatResult>,
}

impl Lat {
    /// A test starting `now`: `iters` iterations, or for `duration`.
    pub(super) fn new(
        (kind, wr, server): (LatKind, SendWr, bool),
        iters: u64,
        duration: Option<core::time::Duration>,
        now: Instant,
        reply: super::Reply<LatResult>,
    ) -> Result<Lat, (super::TestError, super::Reply<LatResult>)> {
        if duration.is_none() && (iters == 0 || iters > 1 << 24) {
            return Err((super::TestError::Iterations, reply));
        }
        if duration.is_some_and(|d| d.is_zero()) {
            return Err((super::TestError::ZeroDuration, reply));
        }
        let clock = duration.map(LatClock::new);
        let iters = if clock.is_some() { u64::MAX } else { iters };
        Ok(Lat {
            kind,
            wr,
            iters,
            server,
            scnt: 0,
            rcnt: 0,
            ccnt: 0,
            sends_done: 0,
            recvs_done: 0,
            reposted: 0,
            step: LatStep::Wait,
            started: now,
            clock,
            posted: Vec::with_capacity(if clock.is_some() { 0 } else { iters as usize }),
            errors: 0,
            failure: None,
            reply,
        })
    }

    /// Advances the test as far as it can go now (`wcs` is scratch); whether it posted, and
    /// its result once it is done.
    pub(super) fn drive(
        &mut self,
        qp: &mut RcQp,
        cqs: [&mut crate::cq::CompletionQueue; 2],
        mrs: &mut MrTable,
        wcs: &mut Vec<WorkCompletion>,
        now: Instant,
    ) -> (bool, Option<LatResult>) {
        let t = self;
        wcs.clear();
        let [scq, rcq] = cqs;
        scq.poll(usize::MAX, wcs);
        rcq.poll(usize::MAX, wcs);
        for c in wcs.iter() {
            if c.status != WcStatus::Success {
                t.errors += 1;
                if t.failure.is_none() {
                    t.failure = Some(format!(
                        "{:?} completion of {:?} (wr_id {})",
                        c.status, c.opcode, c.wr_id
                    ));
                }
            } else if c.opcode == WcOpcode::Recv {
                t.recvs_done += 1;
            } else {
                t.sends_done += 1;
            }
        }
        let mut posted = false;
        let since = now.0.saturating_sub(t.started.0);
        let timed_out = t.clock.as_mut().is_some_and(|c| c.tick(now, since));
        let failed = loop {
            if timed_out {
                break false;
            }
            if t.errors > 0 || qp.cfg.state == QpState::Err {
                if t.failure.is_none() {
                    t.failure = Some(format!("the QP is in {:?}", qp.cfg.state));
                }
                break true;
            }
            if t.scnt >= t.iters && t.rcnt >= t.iters && t.ccnt >= t.iters {
                break false;
            }
            match t.step {
                LatStep::Wait => {
                    match &t.kind {
                        LatKind::Request => t.rcnt = t.scnt.min(t.iters),
                        LatKind::Write { poll, .. } => {
                            // The server posts first: it waits only once it has posted.
                            if t.rcnt < t.iters && (!t.server || t.scnt > 0) {
                                let mut b = [0u8; 1];
                                let seen = mrs.get(poll.0).and_then(|m| m.read(poll.1, &mut b));
                                if let Err(e) = seen {
                                    t.errors += 1;
                                    t.failure = Some(format!("reading the polled byte: {e}"));
                                    continue;
                                }
                                if b[0] != (t.rcnt + 1) as u8 {
                                    break false;
                                }
                                t.rcnt += 1;
                            }
                        }
                        LatKind::Send { recv, rx_depth } => {
                            // The client posts first.
                            if t.rcnt < t.iters && (t.server || t.scnt > 0) {
                                if t.recvs_done == 0 {
                                    break false;
                                }
                                t.recvs_done -= 1;
                                t.rcnt += 1;
                                if t.rcnt + rx_depth <= t.iters {
                                    let mut r = *recv;
                                    r.wr_id = recv.wr_id.wrapping_add(t.reposted);
                                    if let Err(e) = qp.post_recv(r) {
                                        t.errors += 1;
                                        t.failure = Some(format!("reposting a receive: {e}"));
                                        continue;
                                    }
                                    t.reposted += 1;
                                }
                            }
                        }
                    }
                    t.step = LatStep::Post;
                }
                LatStep::Post => {
                    if t.scnt < t.iters {
                        if let LatKind::Write { mark, .. } = &t.kind {
                            let b = [(t.scnt + 1) as u8];
                            if let Err(e) = mrs.get_mut(mark.0).and_then(|m| m.write(mark.1, &b)) {
                                t.errors += 1;
                                t.failure = Some(format!("setting the marked byte: {e}"));
                                continue;
                            }
                        }
                        if t.clock.is_none() {
                            t.posted.push(since);
                        }
                        let id = t.wr.wr_id.wrapping_add(t.scnt);
                        qp.observe(now);
                        if let Err(e) = post_copy(qp, mrs, &t.wr, id) {
                            t.errors += 1;
                            t.failure = Some(format!("posting request {}: {e}", t.scnt + 1));
                            continue;
                        }
                        t.scnt += 1;
                        posted = true;
                    }
                    t.step = LatStep::Complete;
                }
                LatStep::Complete => {
                    // READ, atomics and WRITE wait for each completion; SEND counts its
                    // completions as they come (its turn is the peer's message), and waits
                    // only for the last ones, when nothing else is left.
                    let blocking = matches!(t.kind, LatKind::Request | LatKind::Write { .. })
                        || (t.scnt >= t.iters && t.rcnt >= t.iters);
                    if t.ccnt < t.scnt {
                        if t.sends_done == 0 && blocking {
                            break false;
                        }
                        let n = t.sends_done.min(t.scnt - t.ccnt);
                        t.ccnt += n;
                        t.sends_done -= n;
                        if let Some(c) = t.clock.as_mut() {
                            c.completed(n);
                        }
                    }
                    t.step = LatStep::Wait;
                }
            }
        };
        let done = timed_out || (t.scnt >= t.iters && t.rcnt >= t.iters && t.ccnt >= t.iters);
        if !(failed || done) {
            return (posted, None);
        }
        let r = LatResult {
            posted_ns: core::mem::take(&mut t.posted),
            sample: t.clock.map(|c| c.sample()),
            errors: t.errors.max(u64::from(failed && !done)),
            failure: t.failure.take(),
            elapsed_ns: now.0.saturating_sub(t.started.0),
        };
        (posted, Some(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_latency_test_keeps_perftests_clock() {
        let t = |ns: u64| Instant(ns);
        const S: u64 = 1_000_000_000;
        // -D 4: a margin of 1 s, the window from 1 s to 3 s, the end at 4 s.
        let mut c = LatClock::new(core::time::Duration::from_secs(4));
        assert!(!c.tick(t(S / 2), S / 2));
        c.completed(5);
        assert!(!c.tick(t(S + 7), S + 7));
        c.completed(3);
        assert!(!c.tick(t(3 * S + 11), 3 * S + 11));
        c.completed(4);
        assert!(!c.tick(t(4 * S - 1), 4 * S - 1));
        assert!(c.tick(t(4 * S), 4 * S));
        assert_eq!(
            c.sample(),
            LatSample {
                iters: 3,
                window_ns: 2 * S + 4
            }
        );
        // -D 1 and -D 3: no margin (whole seconds over 4), the window is the whole test.
        for d in [1, 3] {
            let mut c = LatClock::new(core::time::Duration::from_secs(d));
            assert!(!c.tick(t(0), 0));
            c.completed(2);
            assert!(c.tick(t(d * S), d * S));
            c.completed(9);
            assert_eq!(c.sample().iters, 2);
            assert_eq!(c.sample().window_ns, d * S);
        }
    }
}
