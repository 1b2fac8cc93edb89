//! perftest's traffic on the lcores: streams, receive streams and latency tests.

use super::*;

/// How long a test on the lcore runs: so many messages or iterations, or so long.
pub(super) enum RunLength {
    Count(u64),
    Duration(Duration),
}

/// Exactly one of `count` (the body's field `name`, 1 to `max`) and `duration_ms` (1 ms to
/// 10 minutes, perftest's -D); anything else is a bad request with `code`.
pub(super) fn count_or_duration(
    (name, count): (&str, Option<u64>),
    max: u64,
    duration_ms: Option<u64>,
    code: &'static str,
) -> Result<RunLength, ApiError> {
    match (count, duration_ms) {
        (Some(_), Some(_)) => Err(ApiError::bad(
            code,
            format!("give {name} or duration_ms, not both"),
        )),
        (None, None) => Err(ApiError::bad(
            code,
            format!("{name} or duration_ms is required"),
        )),
        (Some(c), None) if (1..=max).contains(&c) => Ok(RunLength::Count(c)),
        (Some(_), None) => Err(ApiError::bad(code, format!("{name} is 1 to {max}"))),
        (None, Some(ms)) if (1..=600_000).contains(&ms) => {
            Ok(RunLength::Duration(Duration::from_millis(ms)))
        }
        (None, Some(_)) => Err(ApiError::bad(code, "duration_ms is 1 to 600000")),
    }
}

/// A stream's count and duration: with `duration_ms` (1 ms to 10 minutes, perftest's -D) the
/// count is only an upper bound and may be left out; without it the count is 1 to 100M.
pub(super) fn stream_limits(
    count: Option<u64>,
    default: u64,
    duration_ms: Option<u64>,
) -> Result<(u64, Option<Duration>), ApiError> {
    match duration_ms {
        Some(ms) if (1..=600_000).contains(&ms) && count != Some(0) => {
            Ok((count.unwrap_or(u64::MAX), Some(Duration::from_millis(ms))))
        }
        Some(_) => Err(ApiError::bad(
            "bad_wr",
            "duration_ms is 1 to 600000 (and count, if given, at least 1)",
        )),
        None => {
            let count = count.unwrap_or(default);
            if (1..=100_000_000).contains(&count) {
                Ok((count, None))
            } else {
                Err(ApiError::bad("bad_wr", "count is 1 to 100000000"))
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ByteRef {
    lkey: u32,
    addr: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LatBody {
    test: String,
    wr: SendBody,
    #[serde(default)]
    iters: Option<u64>,
    #[serde(default)]
    duration_ms: Option<u64>,
    #[serde(default)]
    server: bool,
    #[serde(default)]
    poll: Option<ByteRef>,
    #[serde(default)]
    mark: Option<ByteRef>,
    #[serde(default)]
    recv: Option<Vec<SgeBody>>,
    #[serde(default)]
    rx_depth: Option<u64>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StreamTarget {
    qpn: u32,
    #[serde(default)]
    remote_addr: Option<u64>,
    #[serde(default)]
    rkey: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StreamsBody {
    qps: Vec<StreamTarget>,
    wr: SendBody,
    #[serde(default)]
    count: Option<u64>,
    #[serde(default)]
    depth: Option<usize>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    duration_ms: Option<u64>,
    #[serde(default)]
    cq_mod: Option<u32>,
}

/// A stream's `cq_mod` (default 1: every request signalled), 1 to 16384.
fn cq_mod(v: Option<u32>) -> Result<u32, ApiError> {
    match v.unwrap_or(1) {
        m @ 1..=16384 => Ok(m),
        _ => Err(ApiError::bad("bad_wr", "cq_mod is 1 to 16384")),
    }
}

pub(super) async fn streams(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let mut b: StreamsBody = body(&b)?;
    let depth = b.depth.unwrap_or(64);
    let wait_ms = b.timeout_ms.unwrap_or(60_000);
    if b.qps.is_empty()
        || b.qps.len() > MAX_BULK
        || !(1..=16384).contains(&depth)
        || wait_ms > 600_000
    {
        return Err(ApiError::bad(
            "bad_wr",
            format!("qps: 1 to {MAX_BULK}, depth 1 to 16384, timeout_ms at most 600000"),
        ));
    }
    if b.count.is_none() && b.duration_ms.is_none() {
        return Err(ApiError::bad("bad_wr", "count or duration_ms is required"));
    }
    let (count, duration) = stream_limits(b.count, 0, b.duration_ms)?;
    if b.wr.ud.is_some() {
        return Err(ApiError::bad(
            "bad_wr",
            "ud names one destination: stream UD sends with /v1/qps/{qpn}/stream",
        ));
    }
    let mut qps = Vec::with_capacity(b.qps.len());
    for t in &b.qps {
        if t.remote_addr.is_some() {
            b.wr.remote_addr = t.remote_addr;
        }
        if t.rkey.is_some() {
            b.wr.rkey = t.rkey;
        }
        qps.push((t.qpn, send_wr(&b.wr)?));
    }
    let shape = Shape {
        count,
        depth,
        duration,
        cq_mod: cq_mod(b.cq_mod)?,
    };
    let wait = Duration::from_millis(wait_ms) + duration.unwrap_or_default();
    stream_result(blocking(move || s.rdma.streams(qps, shape, wait)).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RecvStreamBody {
    #[serde(default)]
    wr_id: u64,
    #[serde(default)]
    sge: Vec<SgeBody>,
    #[serde(default)]
    count: Option<u64>,
    #[serde(default)]
    posted: u64,
    #[serde(default)]
    timeout_ms: Option<u64>,
    /// Count what arrives within this long of the first arrival instead (perftest's -D).
    #[serde(default)]
    duration_ms: Option<u64>,
    /// /v1/recv-streams only: the QPs.
    #[serde(default)]
    qpns: Option<Vec<u32>>,
}

/// A receive stream as the lcore takes it: the receive to repost, the count (or the
/// duration), the receives already posted, and how long the API waits.
pub(super) struct RecvStreamRun {
    recv: RecvWr,
    count: u64,
    posted: u64,
    duration: Option<Duration>,
    wait: Duration,
}

impl RecvStreamBody {
    /// The run, or what is wrong.
    fn checked(&self) -> Result<RecvStreamRun, ApiError> {
        let wait_ms = self.timeout_ms.unwrap_or(60_000);
        if wait_ms > 600_000 {
            return Err(ApiError::bad("bad_wr", "timeout_ms is at most 600000"));
        }
        let length = count_or_duration(
            ("count", self.count),
            100_000_000,
            self.duration_ms,
            "bad_wr",
        )?;
        let (count, duration) = match length {
            RunLength::Count(c) if self.posted > c => {
                return Err(ApiError::bad("bad_wr", "posted is at most count"));
            }
            RunLength::Count(c) => (c, None),
            RunLength::Duration(d) => (u64::MAX, Some(d)),
        };
        let recv = RecvWr {
            wr_id: self.wr_id,
            sg: sg_list(&self.sge)?,
        };
        Ok(RecvStreamRun {
            recv,
            count,
            posted: self.posted,
            duration,
            wait: Duration::from_millis(wait_ms),
        })
    }
}

/// A stream's result as the API answers it (one shape for `/stream`, `/v1/streams` and the
/// receive streams).
pub(super) fn stream_result(r: dataplane::transport::perftest::StreamResult) -> Reply {
    let best = Some(r.best_ns_per_wr).filter(|b| b.is_finite());
    ok(
        json!({"completed": r.completed, "errors": r.errors, "elapsed_ns": r.elapsed_ns,
              "best_ns_per_wr": best}),
    )
}

pub(super) async fn qp_recv_stream(
    State(s): State<Arc<ApiState>>,
    Path(q): Path<String>,
    b: Bytes,
) -> Reply {
    let qpn = id32("QPN", &q)?;
    let b: RecvStreamBody = body(&b)?;
    if b.qpns.is_some() {
        return Err(ApiError::bad("bad_wr", "qpns belongs to /v1/recv-streams"));
    }
    let run = b.checked()?;
    stream_result(
        blocking(move || {
            s.rdma
                .recv_stream(qpn, run.recv, run.count, run.posted, run.duration, run.wait)
        })
        .await?,
    )
}

pub(super) async fn recv_streams(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: RecvStreamBody = body(&b)?;
    let run = b.checked()?;
    let qpns = b.qpns.unwrap_or_default();
    if qpns.is_empty() || qpns.len() > MAX_BULK {
        return Err(ApiError::bad("bad_wr", format!("qpns: 1 to {MAX_BULK}")));
    }
    stream_result(
        blocking(move || {
            s.rdma.recv_streams(
                qpns,
                run.recv,
                run.count,
                run.posted,
                run.duration,
                run.wait,
            )
        })
        .await?,
    )
}

/// Largest latency test the API runs (its result lists every iteration).
pub(super) const MAX_LAT_ITERS: u64 = 1_000_000;

pub(super) async fn qp_latency(
    State(s): State<Arc<ApiState>>,
    Path(q): Path<String>,
    b: Bytes,
) -> Reply {
    let qpn = id32("QPN", &q)?;
    let b: LatBody = body(&b)?;
    if b.wr.count.is_some() || b.wr.depth.is_some() || b.wr.timeout_ms.is_some() {
        return Err(ApiError::bad(
            "bad_wr",
            "count, depth and timeout_ms belong to /stream",
        ));
    }
    let wr = send_wr(&b.wr)?;
    let wait_ms = b.timeout_ms.unwrap_or(60_000);
    let length = count_or_duration(("iters", b.iters), MAX_LAT_ITERS, b.duration_ms, "bad_test")?;
    let (iters, duration) = match length {
        RunLength::Count(n) => (n, None),
        RunLength::Duration(d) => (0, Some(d)),
    };
    if wait_ms > 600_000 {
        return Err(ApiError::bad("bad_test", "timeout_ms is at most 600000"));
    }
    let missing = |what: &str| ApiError::bad("bad_test", format!("test {} needs {what}", b.test));
    let kind = match b.test.as_str() {
        "request" => LatKind::Request,
        "write" => {
            let (p, m) = (
                b.poll.ok_or_else(|| missing("poll"))?,
                b.mark.ok_or_else(|| missing("mark"))?,
            );
            LatKind::Write {
                poll: (p.lkey, p.addr),
                mark: (m.lkey, m.addr),
            }
        }
        "send" => {
            let sg = sg_list(b.recv.as_deref().ok_or_else(|| missing("recv"))?)?;
            let rx_depth = b.rx_depth.ok_or_else(|| missing("rx_depth"))?;
            LatKind::Send {
                recv: RecvWr { wr_id: 0, sg },
                rx_depth,
            }
        }
        t => {
            return Err(ApiError::bad(
                "bad_test",
                format!("unknown test {t:?}: request, write or send"),
            ));
        }
    };
    let server = b.server;
    let wait = Duration::from_millis(wait_ms) + duration.unwrap_or_default();
    let mut wr = wr;
    let r = blocking(move || {
        wr.ud = ud_dest(&s, qpn, &b.wr)?;
        let r = s
            .rdma
            .latency_test(qpn, kind, wr, iters, duration, server, wait)?;
        Ok::<_, ApiError>(r)
    })
    .await?;
    let sample = r
        .sample
        .map(|x| json!({"iters": x.iters, "window_ns": x.window_ns}));
    ok(
        json!({"posted_ns": r.posted_ns, "errors": r.errors, "failure": r.failure,
              "elapsed_ns": r.elapsed_ns, "sample": sample}),
    )
}

pub(super) async fn qp_stream(
    State(s): State<Arc<ApiState>>,
    Path(q): Path<String>,
    b: Bytes,
) -> Reply {
    let qpn = id32("QPN", &q)?;
    let b: SendBody = body(&b)?;
    let wr = send_wr(&b)?;
    let depth = b.depth.unwrap_or(64);
    let wait_ms = b.timeout_ms.unwrap_or(60_000);
    if !(1..=16384).contains(&depth) || wait_ms > 600_000 {
        return Err(ApiError::bad(
            "bad_wr",
            "depth is 1 to 16384, timeout_ms at most 600000",
        ));
    }
    let (count, duration) = stream_limits(b.count, 1000, b.duration_ms)?;
    let shape = Shape {
        count,
        depth,
        duration,
        cq_mod: cq_mod(b.cq_mod)?,
    };
    let wait = Duration::from_millis(wait_ms) + duration.unwrap_or_default();
    let mut wr = wr;
    let r = blocking(move || {
        wr.ud = ud_dest(&s, qpn, &b)?;
        Ok::<_, ApiError>(s.rdma.stream(qpn, wr, shape, wait)?)
    })
    .await?;
    stream_result(r)
}
