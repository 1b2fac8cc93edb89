//! Work on the QPs: posts, completions, and the perftest runs on the lcores.

use super::*;

/// A kind of test run on an lcore: its name in errors, and the codes of the errors for a
/// refused test and for one whose QP went away before it finished.
pub(super) struct TestKind {
    what: &'static str,
    refused: &'static str,
    ended: &'static str,
}

pub(super) const STREAM: TestKind = TestKind {
    what: "stream",
    refused: "stream_refused",
    ended: "stream_ended",
};
const RECV_STREAM: TestKind = TestKind {
    what: "receive stream",
    ..STREAM
};
const LATENCY: TestKind = TestKind {
    what: "latency test",
    refused: "test_refused",
    ended: "test_ended",
};

impl Rdma {
    /// Posts a send work request.
    pub fn post_send(&self, qpn: u32, wr: SendWr) -> Result<(), RdmaError> {
        let l = self.lcore_of(qpn)?;
        self.ask(l, move |h, now| h.dev.post_send(qpn, &wr, None, now))?
            .map_err(RdmaError::from)
    }

    /// Posts a receive work request.
    pub fn post_recv(&self, qpn: u32, wr: RecvWr) -> Result<(), RdmaError> {
        let l = self.lcore_of(qpn)?;
        self.ask(l, move |h, _| h.dev.post_recv(qpn, wr))?
            .map_err(RdmaError::from)
    }

    /// Takes up to `max` completions of each kind from a QP's own CQs, waiting up to `wait`
    /// for the first; refused for a QP whose completions go to a created CQ.
    pub fn poll_cq(
        &self,
        qpn: u32,
        max: usize,
        wait: Duration,
    ) -> Result<(Vec<WorkCompletion>, Vec<WorkCompletion>), RdmaError> {
        let meta = self
            .qps
            .lock()
            .expect("qp table")
            .get(&qpn)
            .cloned()
            .ok_or_else(|| RdmaError::not_found(format!("no QP {qpn}")))?;
        if let Some(c) = meta.cqs.iter().flatten().next() {
            return Err(RdmaError::conflict(
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

    /// Posts copies of `wr` on the QP's lcore as `shape` says (how many, how many outstanding,
    /// how often signalled); waits for them.
    pub fn stream(
        &self,
        qpn: u32,
        wr: SendWr,
        shape: Shape,
        wait: Duration,
    ) -> Result<StreamResult, RdmaError> {
        self.run_test(vec![qpn], &STREAM, wait, move |h, now, reply| {
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
    ) -> Result<StreamResult, RdmaError> {
        let shape = (count, posted, duration);
        self.run_test(vec![qpn], &RECV_STREAM, wait, move |h, now, reply| {
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
    ) -> Result<StreamResult, RdmaError> {
        let shape = (count, posted, duration);
        self.run_test(qpns.clone(), &RECV_STREAM, wait, move |h, now, reply| {
            h.tests
                .recv_streams(&mut h.dev, now, qpns, recv, shape, reply)
        })
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
    ) -> Result<LatResult, RdmaError> {
        let test = (kind, wr, server);
        self.run_test(vec![qpn], &LATENCY, wait, move |h, now, reply| {
            h.tests
                .latency(&mut h.dev, now, qpn, test, iters, duration, reply)
        })
    }

    /// Hands a test (`f` builds its command around the reply channel) on `qpns`, which must
    /// share one lcore, to that lcore and waits up to `wait` for its result. A test that has
    /// not answered by then is stopped, as a killed perftest leaves it: its QPs go to ERR
    /// and the caller gets `timeout` (504); one that finished meanwhile is answered.
    pub(super) fn run_test<T: Send + 'static>(
        &self,
        qpns: Vec<u32>,
        kind: &TestKind,
        wait: Duration,
        f: impl FnOnce(&mut Shard, dataplane::Instant, Reply<T>) + Send + 'static,
    ) -> Result<T, RdmaError> {
        let what = kind.what;
        let l = self.one_lcore(qpns.iter().copied(), what)?;
        let (tx, rx) = bounded(1);
        self.lcores[l]
            .send(Command::Handler(ApplianceCommand::Rdma(RdmaCommand::test(
                tx, f,
            ))))
            .map_err(|_| RdmaError::internal("lcore_unavailable", "the lcore has stopped"))?;
        let answer =
            |r: Result<T, _>| r.map_err(|e| RdmaError::conflict(kind.refused, format!("{e}")));
        let gone = || {
            RdmaError::conflict(
                kind.ended,
                format!("the QP was destroyed (or the node stopped) before the {what} finished"),
            )
        };
        match rx.recv_timeout(wait) {
            Ok(r) => answer(r),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                // The lcore takes commands in order: the test has started by the time this
                // runs, and a test it stops answers before this returns.
                let stopped =
                    self.ask(l, move |h, now| h.tests.cancel_qps(&mut h.dev, now, &qpns))?;
                let r = rx.try_recv();
                match r {
                    Ok(r) if stopped == 0 => answer(r),
                    Ok(_) | Err(crossbeam_channel::TryRecvError::Empty) => Err(RdmaError {
                        kind: Refusal::TimedOut,
                        code: "timeout",
                        message: format!(
                            "the {what} did not finish in {wait:?}: it was stopped and its QPs \
                             moved to ERR (modify them to RESET to use them again)"
                        ),
                    }),
                    Err(crossbeam_channel::TryRecvError::Disconnected) => Err(gone()),
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(gone()),
        }
    }

    /// Completion latency by opcode, every lcore's histograms added together.
    pub fn latency(&self) -> Result<LatencyHistograms, RdmaError> {
        let mut all = LatencyHistograms::default();
        for l in 0..self.lcores.len() {
            all.add(&self.ask(l, |h, _| h.dev.latencies())?);
        }
        Ok(all)
    }

    /// Every lcore's RDMA counters.
    pub fn counters(&self) -> Result<Vec<HostCounters>, RdmaError> {
        (0..self.lcores.len())
            .map(|l| self.ask(l, |h, now| h.counters(now)))
            .collect()
    }

    /// Ends every running stream and latency test on every lcore (the node is stopping):
    /// their QPs go to ERR and each test answers its caller at once. How many QPs stopped.
    pub fn cancel_tests(&self) -> Result<usize, RdmaError> {
        (0..self.lcores.len())
            .map(|l| self.ask(l, |h, now| h.tests.cancel(&mut h.dev, now)))
            .sum()
    }

    /// The DCQCN line rate QPs start at.
    pub fn line_bps(&self) -> f64 {
        self.line_bps
    }
}
