//! Bandwidth streams: a send stream keeps `depth` copies of one work request posted until
//! `count` have completed (or its time is up); a receive stream keeps receives posted and
//! counts arrivals (perftest's SEND server). No control round trip per message.

use super::Reply;
use crate::cq::WcStatus;
use crate::mr::MrTable;
use crate::qp::QpState;
use crate::rc::{PostError, RcQp};
use crate::wr::{RecvWr, SendWr};
use wire::time::Instant;

/// How long a timed receive stream keeps reposting after its window: the sender's last
/// messages, posted up to its own deadline, must still find receives (a sender's run ends
/// when everything it posted has completed).
pub const RECV_DRAIN: core::time::Duration = core::time::Duration::from_secs(1);

/// What a stream did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamResult {
    /// Work requests completed successfully.
    pub completed: u64,
    /// Work requests completed in error or never posted.
    pub errors: u64,
    /// From the first post to the last completion, nanoseconds of lcore time.
    pub elapsed_ns: u64,
    /// The fewest nanoseconds per work request from the first post to any completion
    /// (perftest's peak: the best the run ever averaged since its start).
    pub best_ns_per_wr: f64,
}

/// A send stream's shape: `count` requests (in duration mode only a bound), `depth` of them
/// outstanding at most, posting for `duration` at most, and every `cq_mod`-th request
/// signalled (perftest's `--cq-mod`, 100 in its bandwidth tests; 1 signals every one). A
/// completion stands for the requests since the one before it (RC completes in order). The
/// last request is always signalled; `cq_mod` is held to `depth` (as perftest holds it to
/// its tx depth), so that some request in every window is; a timed stream signals every
/// request, since it cannot know which one is last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Requests.
    pub count: u64,
    /// Outstanding at most.
    pub depth: usize,
    /// Posting for this long at most.
    pub duration: Option<core::time::Duration>,
    /// One request in this many signalled.
    pub cq_mod: u32,
}

impl From<(u64, usize, Option<core::time::Duration>)> for Shape {
    /// Every request signalled.
    fn from((count, depth, duration): (u64, usize, Option<core::time::Duration>)) -> Shape {
        Shape {
            count,
            depth,
            duration,
            cq_mod: 1,
        }
    }
}

/// Where a finished stream reports.
pub(super) enum StreamReply {
    /// Its own caller.
    One(Reply<StreamResult>),
    /// The group (index in `Tests::groups`) of a several-QP run.
    Group(usize),
}

/// A stream of identical work requests kept posted.
pub(super) struct Stream {
    /// The request, signalled.
    wr: SendWr,
    /// The request, not signalled.
    quiet: SendWr,
    depth: usize,
    cq_mod: u64,
    /// Requests posted since the last signalled one.
    unsignaled: u64,
    to_post: u64,
    /// `to_post` when the request the latest completion was for was posted (one more than
    /// the count before any).
    completed_at: u64,
    outstanding: usize,
    pub(super) done: u64,
    errors: u64,
    started: Instant,
    /// No more posts from this time on (duration mode).
    until: Option<Instant>,
    /// The fewest nanoseconds per completed work request over any prefix of the run.
    best_ns_per_wr: f64,
    pub(super) reply: StreamReply,
}

/// Posts a copy of `wr` under `wr_id` (a stream's or a latency test's next request), its
/// inline bytes gathered first.
pub(super) fn post_copy(
    qp: &mut RcQp,
    mrs: &MrTable,
    wr: &SendWr,
    wr_id: u64,
) -> Result<(), PostError> {
    if !wr.inline {
        // (Not through `inline_bytes`: its answer, 520 bytes, is copied even when empty.)
        return qp.post_send(wr, wr_id, None);
    }
    let d = crate::wr::inline_bytes(mrs, qp.pd, wr)?;
    qp.post_send(wr, wr_id, d.as_deref())
}

impl Stream {
    /// A stream starting `now`: `count` copies of `wr`, `depth` outstanding, posting for
    /// `duration` at most.
    pub(super) fn new(wr: SendWr, shape: Shape, now: Instant, reply: StreamReply) -> Stream {
        let Shape {
            count,
            depth,
            duration,
            cq_mod,
        } = shape;
        let depth = depth.max(1);
        let cq_mod = if duration.is_some() {
            1
        } else {
            (cq_mod as u64).clamp(1, depth as u64)
        };
        Stream {
            wr: SendWr {
                signaled: true,
                ..wr
            },
            quiet: SendWr {
                signaled: false,
                ..wr
            },
            depth,
            cq_mod,
            unsignaled: 0,
            to_post: count,
            completed_at: count.wrapping_add(1),
            outstanding: 0,
            done: 0,
            errors: 0,
            started: now,
            until: duration.map(|d| now + d),
            best_ns_per_wr: f64::INFINITY,
            reply,
        }
    }

    /// Its errors, and, when it ends early, what it had not done (in duration mode what it
    /// had not posted is not owed: its count is only a bound).
    pub(super) fn undone(&self) -> u64 {
        let unposted = if self.until.is_some() {
            0
        } else {
            self.to_post
        };
        self.errors
            .saturating_add(unposted)
            .saturating_add(self.outstanding as u64)
    }

    /// Takes the QP's send completions and tops its send queue up; whether it posted, and
    /// its result once it is over.
    pub(super) fn feed(
        &mut self,
        qp: &mut RcQp,
        scq: &mut crate::cq::CompletionQueue,
        mrs: &MrTable,
        now: Instant,
    ) -> (bool, Option<StreamResult>) {
        let before = self.done;
        let base = self.wr.wr_id;
        scq.drain_each(|c| {
            // The requests from the one after the previous completion's to this one's: the
            // ones before it succeeded (in order), it may not have.
            let at = c.wr_id.wrapping_sub(base);
            let covered = self
                .completed_at
                .wrapping_sub(at)
                .clamp(1, self.outstanding.max(1) as u64);
            self.completed_at = at;
            self.outstanding = self.outstanding.saturating_sub(covered as usize);
            if c.status == WcStatus::Success {
                self.done += covered;
            } else {
                self.done += covered - 1;
                self.errors += 1;
            }
        });
        if self.done > before {
            let per = now.0.saturating_sub(self.started.0) as f64 / self.done as f64;
            self.best_ns_per_wr = self.best_ns_per_wr.min(per);
        }
        let mut posted = false;
        qp.observe(now);
        if self.until.is_some_and(|t| now >= t) {
            // Duration mode: the time is up; the run ends when what is out completes.
            self.to_post = 0;
        }
        while self.to_post > 0 && self.outstanding < self.depth {
            let id = self.wr.wr_id.wrapping_add(self.to_post);
            // Every cq_mod-th request from the start, and the last.
            let signal = self.unsignaled + 1 == self.cq_mod || self.to_post == 1;
            let wr = if signal { &self.wr } else { &self.quiet };
            if post_copy(qp, mrs, wr, id).is_err() {
                break;
            }
            self.unsignaled = if signal { 0 } else { self.unsignaled + 1 };
            self.to_post -= 1;
            self.outstanding += 1;
            posted = true;
        }
        let failed = qp.cfg.state == QpState::Err;
        if self.to_post == 0 && self.outstanding == 0 || failed {
            let r = StreamResult {
                completed: self.done,
                errors: self.undone(),
                elapsed_ns: now.0.saturating_sub(self.started.0),
                best_ns_per_wr: self.best_ns_per_wr,
            };
            return (posted, Some(r));
        }
        (posted, None)
    }
}

/// A stream of receives kept posted.
pub(super) struct RecvStream {
    recv: RecvWr,
    count: u64,
    /// A timed stream's window in ns (perftest's -D): arrivals are counted within it, after
    /// a margin from the first one; `count` is unused.
    pub(super) window_ns: Option<u64>,
    /// A timed stream's margin in ns before and after its window.
    margin_ns: u64,
    /// Arrivals outside a timed stream's window (received and reposted, not counted).
    uncounted: u64,
    /// Receives posted so far, before and during the stream.
    posted: u64,
    pub(super) done: u64,
    errors: u64,
    first: Option<Instant>,
    best_ns_per_wr: f64,
    pub(super) reply: StreamReply,
}

/// How a receive stream ended: its result, and for a group the span its run counts
/// (from, to).
pub(super) struct RecvEnd {
    pub(super) result: StreamResult,
    pub(super) span: (Option<Instant>, Instant),
}

impl RecvStream {
    pub(super) fn new(
        recv: RecvWr,
        count: u64,
        posted: u64,
        duration: Option<core::time::Duration>,
        reply: StreamReply,
    ) -> Self {
        RecvStream {
            recv,
            count,
            window_ns: duration.map(|d| d.as_nanos().min(u64::MAX as u128) as u64),
            // perftest: margin = duration / 4, in whole seconds.
            margin_ns: duration.map_or(0, |d| d.as_secs() / 4 * 1_000_000_000),
            uncounted: 0,
            posted,
            done: 0,
            errors: 0,
            first: None,
            best_ns_per_wr: f64::INFINITY,
            reply,
        }
    }

    /// What it has not received, as errors: the rest of the count, or for a timed stream
    /// that was cut short, one.
    pub(super) fn undone(&self) -> u64 {
        match self.window_ns {
            Some(_) => 1,
            None => self.count - self.done,
        }
    }

    /// Whether it wants another receive posted (besides room on the QP).
    fn wants_more(&self) -> bool {
        self.window_ns.is_some() || self.posted < self.count
    }

    /// Whether it is over at `now`.
    fn over(&self, now: Instant) -> bool {
        match (self.window_ns, self.first) {
            (Some(w), Some(f)) => {
                let total = w
                    .saturating_add(2 * self.margin_ns)
                    .saturating_add(RECV_DRAIN.as_nanos() as u64);
                now.0.saturating_sub(f.0) >= total
            }
            (Some(_), None) => false,
            (None, _) => self.done + self.errors >= self.count,
        }
    }

    /// Takes the QP's receive completions (`rcq`) and reposts receives; how it ended, once
    /// it is over. `wcs` is scratch.
    pub(super) fn feed(
        &mut self,
        qp: &mut RcQp,
        rcq: &mut crate::cq::CompletionQueue,
        wcs: &mut Vec<crate::cq::WorkCompletion>,
        now: Instant,
    ) -> Option<RecvEnd> {
        wcs.clear();
        rcq.poll(usize::MAX, wcs);
        for c in wcs.iter() {
            if c.status == WcStatus::Success {
                let first = *self.first.get_or_insert(now);
                let since = now.0.saturating_sub(first.0);
                match self.window_ns {
                    Some(w) if since < self.margin_ns || since - self.margin_ns >= w => {
                        self.uncounted += 1
                    }
                    _ => self.done += 1,
                }
            } else {
                self.errors += 1;
            }
        }
        if let Some(first) = self.first {
            // Per message over the time from the first arrival, as the average is counted
            // (so the best prefix is never below the whole run's average).
            let per = now.0.saturating_sub(first.0) as f64 / self.done.max(1) as f64;
            if per > 0.0 {
                self.best_ns_per_wr = self.best_ns_per_wr.min(per);
            }
        }
        while self.wants_more()
            && self
                .posted
                .saturating_sub(self.done + self.uncounted + self.errors)
                < qp.caps().max_recv_wr as u64
        {
            let mut r = self.recv;
            r.wr_id = self.recv.wr_id.wrapping_add(self.posted);
            if qp.post_recv(r).is_err() {
                break;
            }
            self.posted += 1;
        }
        let failed = qp.cfg.state == QpState::Err || self.errors > 0;
        if !(self.over(now) || failed) {
            return None;
        }
        let (errors, elapsed_ns) = match self.window_ns {
            // A timed stream: its errors (at least one if the QP failed), over its window.
            Some(w) => (self.errors.max(u64::from(failed)), w),
            None => (
                self.count - self.done,
                now.0.saturating_sub(self.first.unwrap_or(now).0),
            ),
        };
        let best_ns_per_wr = match self.window_ns {
            // perftest's duration mode has no peak apart from the average.
            Some(w) => w as f64 / self.done.max(1) as f64,
            None => self.best_ns_per_wr,
        };
        // A timed member's run ends with its window, not with the drain after it.
        let span = match (self.window_ns, self.first) {
            (Some(w), Some(f)) => {
                let start = f.0.saturating_add(self.margin_ns);
                (Some(Instant(start)), Instant(start.saturating_add(w)))
            }
            _ => (self.first, now),
        };
        Some(RecvEnd {
            result: StreamResult {
                completed: self.done,
                errors,
                elapsed_ns,
                best_ns_per_wr,
            },
            span,
        })
    }
}
