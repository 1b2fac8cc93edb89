//! roced's REST API, versioned under `/v1`, on a thread of its own (never a dataplane lcore).
//!
//! Handlers parse and check the request whole, then run the operation on tokio's blocking
//! pool, where [`Rdma`] sends commands to the lcores and waits for their replies. Errors are
//! JSON, `{"code": "...", "message": "..."}`, with a 4xx status for the caller's mistakes and
//! 5xx for the node's. Request bodies are JSON with unknown fields refused, except region data,
//! which is raw bytes (`application/octet-stream`).

use crate::rdma::{
    ApiError, ConnectRequest, QpPlacement, Rdma, access_names, parse_access, parse_gid,
    wc_opcode_name, wc_status_name,
};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dataplane::cc::{CcKind, DcqcnParams};
use dataplane::port::impair::{CongestionPoint, Direction, ImpairHandle, Impairments};
use dataplane::sim::Red;
use dataplane::transport::cq::WorkCompletion;
use dataplane::transport::perftest::LatKind;
use dataplane::transport::qp::{Mtu, QpState, QpType};
use dataplane::transport::rc::QpCaps;
use dataplane::transport::wr::{MAX_SGE, RecvWr, SendOp, SendWr, SgList, Sge, UdDest};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the API serves from besides the RDMA objects.
#[derive(Debug)]
pub struct ApiState {
    /// The node's RDMA objects.
    pub rdma: Rdma,
    /// Per port: its description and statistics, refreshed by the control loop.
    pub ports: Mutex<Vec<Value>>,
    /// Per port, one handle per lcore queue: the impairment stages.
    pub impair: Vec<Vec<ImpairHandle>>,
    /// Per lcore: the poll loop's counters (frames, drops by reason, ARP/ND, ...).
    pub lcore_counters: Vec<Arc<dataplane::counters::LcoreCounters>>,
    /// Per port: the impairments last set, per direction.
    pub impair_cfg: Mutex<Vec<[Value; 2]>>,
    /// The bearer token requests must carry, if one is set (`[api] token`).
    pub token: Option<String>,
    /// Mbufs of the node's pool handed out (in ports' rings, lcores, frames in flight) and
    /// its size, refreshed by the control loop.
    pub mbufs: [std::sync::atomic::AtomicU64; 2],
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            axum::Json(json!({"code": self.code, "message": self.message})),
        )
            .into_response()
    }
}

type Reply = Result<Response, ApiError>;

fn ok(v: Value) -> Reply {
    Ok(axum::Json(v).into_response())
}

fn created(v: Value) -> Reply {
    Ok((StatusCode::CREATED, axum::Json(v)).into_response())
}

/// Parses a JSON body, refusing unknown fields with the serde message.
fn body<T: DeserializeOwned>(b: &Bytes) -> Result<T, ApiError> {
    let b: &[u8] = if b.is_empty() { b"{}" } else { b };
    // Every body is a JSON object (serde would also take a struct's fields from an array).
    if b.iter().find(|c| !c.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad(
            "bad_body",
            "request body: expected a JSON object",
        ));
    }
    serde_json::from_slice(b).map_err(|e| ApiError::bad("bad_body", format!("request body: {e}")))
}

/// A number given in decimal or as 0x-prefixed hex (keys and QPNs are often shown in hex).
fn number(what: &str, s: &str) -> Result<u64, ApiError> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| ApiError::bad("bad_path", format!("{what} {s:?} is not a number")))
}

fn id32(what: &str, s: &str) -> Result<u32, ApiError> {
    let n = number(what, s)?;
    u32::try_from(n).map_err(|_| ApiError::bad("bad_path", format!("{what} {s} is too large")))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal("internal", format!("the operation failed: {e}")))?
}

/// The router for `state`.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/ports", get(ports))
        .route("/v1/ports/{port}", get(port_show))
        .route("/v1/pds", get(pd_list).post(pd_alloc))
        .route("/v1/pds/{pdn}", get(pd_show).delete(pd_dealloc))
        .route("/v1/cqs", get(cq_list).post(cq_create))
        .route("/v1/cqs/{cqn}", get(cq_show).delete(cq_destroy))
        .route("/v1/cqs/{cqn}/completions", get(cq_poll))
        .route("/v1/ports/{port}/impair", get(impair_show).put(impair_set))
        .route("/v1/mrs", get(mr_list).post(mr_reg))
        .route("/v1/mrs/{key}", get(mr_show).delete(mr_dereg))
        .route("/v1/mrs/{key}/data", get(mr_read).put(mr_write))
        .route("/v1/qps", get(qp_list).post(qp_create))
        .route("/v1/qps/{qpn}", get(qp_show).delete(qp_destroy))
        .route("/v1/qps/{qpn}/connect", post(qp_connect))
        .route("/v1/qps/{qpn}/modify", post(qp_modify))
        .route("/v1/qps/{qpn}/cc", axum::routing::put(qp_set_cc))
        .route("/v1/qps/{qpn}/send", post(qp_send))
        .route("/v1/qps/{qpn}/recv", post(qp_recv))
        .route("/v1/qps/{qpn}/completions", get(qp_poll))
        .route("/v1/qps/{qpn}/stream", post(qp_stream))
        .route("/v1/qps/{qpn}/latency", post(qp_latency))
        .route("/v1/qps/bulk", post(qp_bulk_create))
        .route("/v1/qps/bulk/connect", post(qp_bulk_connect))
        .route("/v1/qps/bulk/destroy", post(qp_bulk_destroy))
        .route("/v1/streams", post(streams))
        .route("/v1/qps/{qpn}/recv-stream", post(qp_recv_stream))
        .route("/v1/recv-streams", post(recv_streams))
        .route("/v1/stats", get(stats))
        .method_not_allowed_fallback(|req: axum::extract::Request| async move {
            ApiError {
                status: 405,
                code: "method_not_allowed",
                message: format!("{} does not take {}", req.uri().path(), req.method()),
            }
            .into_response()
        })
        .fallback(|| async {
            ApiError::not_found("no such endpoint (the API is under /v1)").into_response()
        })
        // Request bodies up to 64 MiB: bulk QP requests for 200k QPs, and region writes.
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authorize,
        ))
        .with_state(state)
}

/// Largest request body the API reads (axum's default is 2 MiB).
pub const MAX_BODY: usize = 64 << 20;

/// With a token set, every request but the liveness check must carry it as a bearer token.
async fn authorize(
    State(s): State<Arc<ApiState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(token) = &s.token else {
        return next.run(req).await;
    };
    if req.uri().path() == "/v1/health" {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_credentials);
    // Compared in constant time: how much of a guess matched must not show in the timing.
    let ok = given.is_some_and(|g| {
        g.len() == token.len()
            && g.bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    });
    if ok {
        next.run(req).await
    } else {
        let mut r = ApiError {
            status: 401,
            code: "unauthorized",
            message: "this node's API needs `Authorization: Bearer <token>` ([api] token)".into(),
        }
        .into_response();
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        r
    }
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is matched without
/// regard to case (RFC 7235, 2.1), then one or more spaces.
fn bearer_credentials(v: &str) -> Option<&str> {
    let (scheme, rest) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

/// A query string parsed, or the JSON error that says what is wrong with it.
fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::bad("bad_query", e.body_text()))
}

async fn openapi() -> Reply {
    ok(crate::openapi::document())
}

async fn health(State(s): State<Arc<ApiState>>) -> Reply {
    ok(json!({"status": "ok", "lcores": s.rdma.lcores()}))
}

/// The ports' view with each port's GID table added.
fn ports_with_gids(s: &ApiState) -> Vec<Value> {
    let mut v = s.ports.lock().expect("ports").clone();
    for (i, p) in v.iter_mut().enumerate() {
        let gids: Vec<String> = s.rdma.gids(i).iter().map(|g| g.to_string()).collect();
        p["gids"] = json!(gids);
    }
    v
}

async fn ports(State(s): State<Arc<ApiState>>) -> Reply {
    ok(Value::Array(ports_with_gids(&s)))
}

async fn port_show(State(s): State<Arc<ApiState>>, Path(p): Path<String>) -> Reply {
    let i = port_index(&s, &p)?;
    ports_with_gids(&s)
        .get(i)
        .cloned()
        .map(ok)
        .unwrap_or_else(|| Err(ApiError::not_found(format!("no port {i}"))))
}

// ---- protection domains ----

async fn pd_alloc(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    // No attributes; an empty body or an empty object.
    if !b.is_empty() {
        let _: serde_json::Map<String, Value> = body(&b).and_then(|m: serde_json::Map<_, _>| {
            if m.is_empty() {
                Ok(m)
            } else {
                Err(ApiError::bad(
                    "bad_body",
                    "a protection domain takes no attributes",
                ))
            }
        })?;
    }
    let pd = blocking(move || s.rdma.alloc_pd()).await?;
    created(json!(pd))
}

async fn pd_list(State(s): State<Arc<ApiState>>) -> Reply {
    ok(json!(s.rdma.list_pds()))
}

async fn pd_show(State(s): State<Arc<ApiState>>, Path(p): Path<String>) -> Reply {
    let pdn = id32("PD", &p)?;
    ok(json!(s.rdma.show_pd(pdn)?))
}

async fn pd_dealloc(State(s): State<Arc<ApiState>>, Path(p): Path<String>) -> Reply {
    let pdn = id32("PD", &p)?;
    blocking(move || s.rdma.dealloc_pd(pdn)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

// ---- completion queues ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CqBody {
    cqe: u64,
    #[serde(default)]
    lcore: Option<usize>,
}

async fn cq_create(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: CqBody = body(&b)?;
    let cqe = usize::try_from(b.cqe).unwrap_or(usize::MAX);
    let cq = blocking(move || s.rdma.create_cq(cqe, b.lcore)).await?;
    created(json!(cq))
}

async fn cq_list(State(s): State<Arc<ApiState>>) -> Reply {
    let v = blocking(move || s.rdma.list_cqs()).await?;
    ok(json!(v))
}

async fn cq_show(State(s): State<Arc<ApiState>>, Path(c): Path<String>) -> Reply {
    let cqn = id32("CQN", &c)?;
    let (_, info) = blocking(move || s.rdma.poll_cqn(cqn, 0, Duration::ZERO)).await?;
    ok(json!(info))
}

async fn cq_destroy(State(s): State<Arc<ApiState>>, Path(c): Path<String>) -> Reply {
    let cqn = id32("CQN", &c)?;
    blocking(move || s.rdma.destroy_cq(cqn)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn cq_poll(
    State(s): State<Arc<ApiState>>,
    Path(c): Path<String>,
    p: Result<Query<PollQuery>, QueryRejection>,
) -> Reply {
    let cqn = id32("CQN", &c)?;
    let (max, wait) = poll_limits(query(p)?)?;
    let (wcs, info) = blocking(move || s.rdma.poll_cqn(cqn, max, wait)).await?;
    ok(
        json!({"completions": wcs.iter().map(wc_json).collect::<Vec<_>>(),
              "cq": info}),
    )
}

// ---- impairments ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CongestionBody {
    rate_gbps: f64,
    buffer_kb: u64,
    #[serde(default)]
    kmin_kb: Option<u64>,
    #[serde(default)]
    kmax_kb: Option<u64>,
    #[serde(default)]
    pmax: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImpairBody {
    direction: String,
    #[serde(default)]
    loss: f64,
    #[serde(default)]
    burst: Option<(f64, f64)>,
    #[serde(default)]
    corrupt: f64,
    #[serde(default)]
    duplicate: f64,
    #[serde(default)]
    reorder: f64,
    #[serde(default)]
    reorder_delay_us: Option<f64>,
    #[serde(default)]
    congestion: Option<CongestionBody>,
}

fn port_index(s: &ApiState, p: &str) -> Result<usize, ApiError> {
    let i = number("port", p)? as usize;
    if i >= s.impair.len() {
        return Err(ApiError::not_found(format!(
            "no port {i}: this node has {} port(s)",
            s.impair.len()
        )));
    }
    Ok(i)
}

async fn impair_set(State(s): State<Arc<ApiState>>, Path(p): Path<String>, b: Bytes) -> Reply {
    let port = port_index(&s, &p)?;
    let raw: Value = body(&b)?;
    let b: ImpairBody = body(&b)?;
    let dir = match b.direction.as_str() {
        "rx" => Direction::Rx,
        "tx" => Direction::Tx,
        d => {
            return Err(ApiError::bad(
                "bad_body",
                format!("direction must be \"rx\" or \"tx\", not {d:?}"),
            ));
        }
    };
    let congestion = match &b.congestion {
        None => None,
        Some(c) => {
            if !(c.rate_gbps > 0.0 && c.rate_gbps <= 1000.0) {
                return Err(ApiError::bad(
                    "bad_body",
                    "congestion.rate_gbps must be above 0 and at most 1000",
                ));
            }
            const MAX_KB: u64 = 1 << 20;
            if [Some(c.buffer_kb), c.kmin_kb, c.kmax_kb]
                .into_iter()
                .flatten()
                .any(|kb| kb > MAX_KB)
            {
                return Err(ApiError::bad(
                    "bad_body",
                    format!("congestion buffer_kb, kmin_kb and kmax_kb are at most {MAX_KB}"),
                ));
            }
            let red = match (c.kmin_kb, c.kmax_kb) {
                (Some(kmin), Some(kmax)) => Some(Red {
                    kmin: kmin * 1000,
                    kmax: kmax * 1000,
                    pmax: c.pmax.unwrap_or(0.2),
                }),
                (None, None) => None,
                _ => {
                    return Err(ApiError::bad(
                        "bad_body",
                        "congestion needs both kmin_kb and kmax_kb, or neither",
                    ));
                }
            };
            Some(CongestionPoint {
                rate_bps: (c.rate_gbps * 1e9) as u64,
                buffer_bytes: c.buffer_kb * 1000,
                red,
            })
        }
    };
    let delay = b.reorder_delay_us.unwrap_or(20.0);
    if !(0.0..=1e6).contains(&delay) {
        return Err(ApiError::bad(
            "bad_body",
            "reorder_delay_us must be 0 to 1000000",
        ));
    }
    let imp = Impairments {
        loss: b.loss,
        burst: b.burst,
        corrupt: b.corrupt,
        duplicate: b.duplicate,
        reorder: b.reorder,
        reorder_delay: Duration::from_secs_f64(delay / 1e6),
        congestion,
    };
    imp.validate().map_err(|f| {
        ApiError::bad(
            "bad_body",
            format!("impairment field `{f}` is out of range"),
        )
    })?;
    for h in &s.impair[port] {
        h.set(dir, imp)
            .map_err(|e| ApiError::internal("lcore_unavailable", e))?;
    }
    s.impair_cfg.lock().expect("impair cfg")[port][dir as usize] = raw.clone();
    ok(raw)
}

async fn impair_show(State(s): State<Arc<ApiState>>, Path(p): Path<String>) -> Reply {
    let port = port_index(&s, &p)?;
    let cfg = s.impair_cfg.lock().expect("impair cfg")[port].clone();
    let mut dirs = serde_json::Map::new();
    for (name, d, c) in [("rx", 0usize, &cfg[0]), ("tx", 1, &cfg[1])] {
        let mut t: HashMap<&str, u64> = HashMap::new();
        for h in &s.impair[port] {
            let st = if d == 0 { &h.stats.rx } else { &h.stats.tx };
            for (k, v) in [
                ("lost", st.lost.get()),
                ("corrupted", st.corrupted.get()),
                ("duplicated", st.duplicated.get()),
                ("reordered", st.reordered.get()),
                ("ce_marked", st.ce_marked.get()),
                ("cp_dropped", st.cp_dropped.get()),
                ("cp_queue_bytes", st.cp_queue_bytes.get()),
                ("cp_max_bytes", st.cp_max_bytes.get()),
                ("dropped_unlinearizable", st.dropped_unlinearizable.get()),
            ] {
                *t.entry(k).or_default() += v;
            }
        }
        dirs.insert(name.into(), json!({"settings": c, "counters": t}));
    }
    ok(Value::Object(dirs))
}

// ---- memory regions ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MrBody {
    length: u64,
    #[serde(default)]
    pd: Option<u32>,
    #[serde(default)]
    access: Vec<String>,
    #[serde(default)]
    addr: Option<u64>,
}

async fn mr_reg(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: MrBody = body(&b)?;
    let access = parse_access(&b.access)?;
    let len = usize::try_from(b.length)
        .map_err(|_| ApiError::bad("bad_length", "length is too large"))?;
    let info = blocking(move || s.rdma.reg_mr(len, access, b.addr, b.pd)).await?;
    created(json!(info))
}

async fn mr_list(State(s): State<Arc<ApiState>>) -> Reply {
    ok(json!(s.rdma.list_mrs()))
}

async fn mr_show(State(s): State<Arc<ApiState>>, Path(k): Path<String>) -> Reply {
    ok(json!(s.rdma.show_mr(id32("key", &k)?)?))
}

async fn mr_dereg(State(s): State<Arc<ApiState>>, Path(k): Path<String>) -> Reply {
    let key = id32("key", &k)?;
    blocking(move || s.rdma.dereg_mr(key)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DataQuery {
    #[serde(default)]
    addr: Option<u64>,
    #[serde(default)]
    length: Option<u64>,
}

async fn mr_read(
    State(s): State<Arc<ApiState>>,
    Path(k): Path<String>,
    q: Result<Query<DataQuery>, QueryRejection>,
) -> Reply {
    let q = query(q)?;
    let key = id32("key", &k)?;
    let info = s.rdma.show_mr(key)?;
    let addr = q.addr.unwrap_or(info.addr);
    let len = q.length.unwrap_or(info.length as u64) as usize;
    let data = blocking(move || s.rdma.read_mr(key, addr, len)).await?;
    let mut r = data.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(r)
}

async fn mr_write(
    State(s): State<Arc<ApiState>>,
    Path(k): Path<String>,
    q: Result<Query<DataQuery>, QueryRejection>,
    b: Bytes,
) -> Reply {
    let q = query(q)?;
    let key = id32("key", &k)?;
    let info = s.rdma.show_mr(key)?;
    if q.length.is_some_and(|l| l != b.len() as u64) {
        return Err(ApiError::bad(
            "bad_length",
            "length, when given, must equal the body's size",
        ));
    }
    let addr = q.addr.unwrap_or(info.addr);
    let n = b.len();
    blocking(move || s.rdma.write_mr(key, addr, &b)).await?;
    ok(json!({"written": n, "addr": addr}))
}

// ---- queue pairs ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QpBody {
    #[serde(default)]
    lcore: Option<usize>,
    #[serde(default)]
    pd: Option<u32>,
    #[serde(default)]
    send_cq: Option<u32>,
    #[serde(default)]
    recv_cq: Option<u32>,
    #[serde(default)]
    max_send_wr: Option<u32>,
    #[serde(default)]
    max_recv_wr: Option<u32>,
    #[serde(default)]
    max_send_sge: Option<u32>,
    #[serde(default)]
    max_recv_sge: Option<u32>,
    #[serde(default)]
    max_inline_data: Option<u32>,
    #[serde(default)]
    cc: Option<String>,
    #[serde(default)]
    cc_profile: Option<String>,
    /// DCQCN knobs (NVIDIA's names) over the profile's values.
    #[serde(default)]
    dcqcn: Option<serde_json::Map<String, Value>>,
    /// Copy payloads into frames instead of attaching them (comparison, debugging).
    #[serde(default)]
    copy_tx: bool,
    /// "RC" (the default) or "UD".
    #[serde(default, rename = "type")]
    qp_type: Option<String>,
}

fn qp_type_of(name: Option<&str>) -> Result<QpType, ApiError> {
    match name {
        None | Some("RC") => Ok(QpType::Rc),
        Some("UD") => Ok(QpType::Ud),
        Some(x) => Err(ApiError::bad(
            "bad_type",
            format!("type {x:?}: use RC or UD"),
        )),
    }
}

/// A DCQCN parameter set: a named profile with some knobs changed; the error names a bad knob.
fn dcqcn_params(
    profile: &str,
    knobs: Option<&serde_json::Map<String, Value>>,
) -> Result<DcqcnParams, ApiError> {
    with_knobs(profile_params(profile)?, knobs)
}

fn profile_params(profile: &str) -> Result<DcqcnParams, ApiError> {
    DcqcnParams::profile(profile).ok_or_else(|| {
        ApiError::bad(
            "bad_cc",
            format!(
                "unknown cc_profile {profile:?}: use one of {}",
                DcqcnParams::PROFILES.join(", ")
            ),
        )
    })
}

/// `base` with some knobs (NVIDIA's names) changed, checked whole.
fn with_knobs(
    base: DcqcnParams,
    knobs: Option<&serde_json::Map<String, Value>>,
) -> Result<DcqcnParams, ApiError> {
    let Some(knobs) = knobs else {
        return Ok(base);
    };
    let mut v =
        serde_json::to_value(base).map_err(|e| ApiError::internal("internal", e.to_string()))?;
    for (k, x) in knobs {
        v[k.as_str()] = x.clone();
    }
    let p: DcqcnParams =
        serde_json::from_value(v).map_err(|e| ApiError::bad("bad_cc", format!("dcqcn: {e}")))?;
    p.validate()
        .map_err(|e| ApiError::bad("bad_cc", format!("dcqcn: {e}")))?;
    Ok(p)
}

async fn qp_create(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: QpBody = body(&b)?;
    let d = QpCaps::default();
    let caps = QpCaps {
        max_send_wr: b.max_send_wr.unwrap_or(d.max_send_wr),
        max_recv_wr: b.max_recv_wr.unwrap_or(d.max_recv_wr),
        max_send_sge: b.max_send_sge.unwrap_or(d.max_send_sge),
        max_recv_sge: b.max_recv_sge.unwrap_or(d.max_recv_sge),
        max_inline_data: b.max_inline_data.unwrap_or(0),
        copy_tx: b.copy_tx,
        qp_type: qp_type_of(b.qp_type.as_deref())?,
    };
    let cc: CcKind =
        b.cc.as_deref()
            .unwrap_or("dcqcn")
            .parse()
            .map_err(|e: &str| ApiError::bad("bad_cc", e))?;
    let params = dcqcn_params(
        b.cc_profile.as_deref().unwrap_or("nvidia"),
        b.dcqcn.as_ref(),
    )?;
    let place = QpPlacement {
        pd: b.pd,
        cqs: [b.send_cq, b.recv_cq],
    };
    let (qpn, lcore, psn) =
        blocking(move || s.rdma.create_qp(b.lcore, caps, place, cc, params)).await?;
    created(
        json!({"qpn": qpn, "lcore": lcore, "type": caps.qp_type.name(), "state": "RESET", "sq-psn": psn}),
    )
}

fn qp_json(lcore: usize, q: &dataplane::transport::device::QpQuery, qpn: u32) -> Value {
    let c = &q.cfg;
    let counters: serde_json::Map<String, Value> = q
        .counters
        .named()
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "lqpn": qpn, "rqpn": c.dest_qp, "type": c.qp_type.name(), "state": c.state.name(),
        "qkey": (c.qp_type == QpType::Ud).then_some(c.qkey),
        "rq-psn": c.rq_psn.value(), "sq-psn": c.sq_psn.value(), "pdn": q.pd, "lcore": lcore, "port": q.port,
        "send-cq": q.cqs[0], "recv-cq": q.cqs[1],
        "path-mtu": c.path_mtu.map(|m| m.bytes()),
        "remote-gid": c.path.map(|p| p.remote_ip.to_string()),
        "local-gid": c.path.map(|p| p.local_ip.to_string()),
        "udp-sport": c.path.map(|p| p.udp_sport),
        "timeout": c.timeout, "retry-cnt": c.retry_cnt, "rnr-retry": c.rnr_retry,
        "max-rd-atomic": c.max_rd_atomic, "max-dest-rd-atomic": c.max_dest_rd_atomic,
        "access": access_names(c.access),
        "caps": {"max_send_wr": q.caps.max_send_wr, "max_recv_wr": q.caps.max_recv_wr,
                 "max_send_sge": q.caps.max_send_sge, "max_recv_sge": q.caps.max_recv_sge,
                 "max_inline_data": q.caps.max_inline_data, "copy_tx": q.caps.copy_tx},
        "cc": {"kind": q.cc_kind, "rate_bps": q.rate_bps,
               "target_bps": q.dcqcn.map(|d| d.0), "alpha": q.dcqcn.map(|d| d.1),
               "dcqcn": q.cc_params},
        "counters": counters,
    })
}

async fn qp_list(State(s): State<Arc<ApiState>>) -> Reply {
    let v = blocking(move || {
        let qps = s.rdma.list_qps()?;
        Ok(qps.iter().map(|(qpn, l, q)| qp_json(*l, q, *qpn)).collect())
    })
    .await?;
    ok(Value::Array(v))
}

async fn qp_show(State(s): State<Arc<ApiState>>, Path(q): Path<String>) -> Reply {
    let qpn = id32("QPN", &q)?;
    let (l, q) = blocking(move || s.rdma.query_qp(qpn)).await?;
    ok(qp_json(l, &q, qpn))
}

async fn qp_destroy(State(s): State<Arc<ApiState>>, Path(q): Path<String>) -> Reply {
    let qpn = id32("QPN", &q)?;
    blocking(move || s.rdma.destroy_qp(qpn)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn default_access() -> Vec<String> {
    ["remote-write", "remote-read", "remote-atomic"]
        .map(String::from)
        .to_vec()
}

/// A QP's attributes, for connect (RESET to RTS at once) and modify (one state at a time).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QpAttrBody {
    /// The target state: only for modify.
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    remote_qpn: Option<u32>,
    #[serde(default)]
    remote_gid: Option<String>,
    #[serde(default)]
    remote_psn: Option<u32>,
    #[serde(default)]
    local_psn: Option<u32>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    timeout: Option<u8>,
    #[serde(default)]
    retry_cnt: Option<u8>,
    #[serde(default)]
    rnr_retry: Option<u8>,
    #[serde(default)]
    min_rnr_timer: Option<u8>,
    #[serde(default)]
    max_rd_atomic: Option<u8>,
    #[serde(default)]
    access: Option<Vec<String>>,
    #[serde(default)]
    dscp: Option<u8>,
    /// A UD QP's Q_Key (INIT).
    #[serde(default)]
    qkey: Option<u32>,
    /// A UD QP's port (INIT; default 0).
    #[serde(default)]
    port: Option<usize>,
}

impl QpAttrBody {
    /// The attributes given that a QP of type `ty` does not take, if any.
    fn foreign(&self, ty: QpType) -> Option<&'static str> {
        let rc = [
            ("remote_qpn", self.remote_qpn.is_some()),
            ("remote_gid", self.remote_gid.is_some()),
            ("remote_psn", self.remote_psn.is_some()),
            ("mtu", self.mtu.is_some()),
            ("timeout", self.timeout.is_some()),
            ("retry_cnt", self.retry_cnt.is_some()),
            ("rnr_retry", self.rnr_retry.is_some()),
            ("min_rnr_timer", self.min_rnr_timer.is_some()),
            ("max_rd_atomic", self.max_rd_atomic.is_some()),
            ("access", self.access.is_some()),
            ("dscp", self.dscp.is_some()),
        ];
        let ud = [("qkey", self.qkey.is_some()), ("port", self.port.is_some())];
        let theirs: &[(&'static str, bool)] = match ty {
            QpType::Rc => &ud,
            QpType::Ud => &rc,
        };
        theirs.iter().find(|(_, given)| *given).map(|(n, _)| *n)
    }
}

/// The attributes checked, with the defaults `rdma_rxe`/perftest use where absent. The remote
/// QPN and GID are required when `need_remote`.
fn attr_request(b: &QpAttrBody, need_remote: bool) -> Result<ConnectRequest, ApiError> {
    let mtu_bytes = b.mtu.unwrap_or(1024);
    let mtu = Mtu::from_bytes(mtu_bytes).ok_or_else(|| {
        ApiError::bad(
            "bad_attr",
            format!("mtu must be 256, 512, 1024, 2048 or 4096, not {mtu_bytes}"),
        )
    })?;
    let check = |name: &str, v: Option<u8>, max: u8, def: u8| -> Result<u8, ApiError> {
        match v {
            Some(x) if x > max => Err(ApiError::bad(
                "bad_attr",
                format!("{name} must be 0 to {max}"),
            )),
            Some(x) => Ok(x),
            None => Ok(def),
        }
    };
    let missing = |f: &str| ApiError::bad("bad_attr", format!("{f} is required here"));
    let (remote_qpn, remote_gid) = match (b.remote_qpn, &b.remote_gid) {
        (Some(q), Some(g)) => (q, parse_gid(g)?),
        (None, _) if need_remote => return Err(missing("remote_qpn")),
        (_, None) if need_remote => return Err(missing("remote_gid")),
        (q, g) => (
            q.unwrap_or(0),
            match g {
                Some(g) => parse_gid(g)?,
                None => std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            },
        ),
    };
    Ok(ConnectRequest {
        remote_qpn,
        remote_gid,
        remote_psn: b.remote_psn,
        local_psn: b.local_psn,
        mtu,
        timeout: check("timeout", b.timeout, 31, 14)?,
        retry_cnt: check("retry_cnt", b.retry_cnt, 7, 7)?,
        rnr_retry: check("rnr_retry", b.rnr_retry, 7, 7)?,
        min_rnr_timer: check("min_rnr_timer", b.min_rnr_timer, 31, 1)?,
        max_rd_atomic: check("max_rd_atomic", b.max_rd_atomic, 16, 16)?,
        access: parse_access(b.access.as_deref().unwrap_or(&default_access()))?,
        dscp: check("dscp", b.dscp, 63, 26)?,
        qkey: b.qkey,
        port: b.port.unwrap_or(0),
    })
}

async fn qp_connect(State(s): State<Arc<ApiState>>, Path(q): Path<String>, b: Bytes) -> Reply {
    let qpn = id32("QPN", &q)?;
    let b: QpAttrBody = body(&b)?;
    if b.state.is_some() {
        return Err(ApiError::bad(
            "bad_attr",
            "connect goes to RTS; use /modify for one state at a time",
        ));
    }
    if let Some(x) = b.foreign(QpType::Rc) {
        return Err(ApiError::bad(
            "bad_attr",
            format!("{x} is for a UD QP's modify to INIT"),
        ));
    }
    blocking(move || {
        if s.rdma.qp_type(qpn)? == QpType::Ud {
            return Err(ApiError::conflict(
                "bad_state",
                dataplane::transport::qp::ModifyError::Datagram.to_string(),
            ));
        }
        let r = attr_request(&b, true)?;
        s.rdma.connect_qp(qpn, &r)?;
        s.rdma.query_qp(qpn)
    })
    .await
    .and_then(|(l, q)| ok(qp_json(l, &q, qpn)))
}

/// One verbs transition: to INIT (access), RTR (remote QPN and GID, its first PSN, MTU,
/// min_rnr_timer, max_rd_atomic as responder), RTS (our first PSN, timeout, retry_cnt,
/// rnr_retry, max_rd_atomic), or SQD, ERR, RESET; attributes a transition does not take are
/// refused by the QP's state machine as verbs refuses them.
async fn qp_modify(State(s): State<Arc<ApiState>>, Path(q): Path<String>, b: Bytes) -> Reply {
    let qpn = id32("QPN", &q)?;
    let b: QpAttrBody = body(&b)?;
    let state = match b.state.as_deref() {
        Some("INIT") => QpState::Init,
        Some("RTR") => QpState::Rtr,
        Some("RTS") => QpState::Rts,
        Some("SQD") => QpState::Sqd,
        Some("ERR") => QpState::Err,
        Some("RESET") => QpState::Reset,
        Some(x) => {
            return Err(ApiError::bad(
                "bad_attr",
                format!("state {x:?}: use INIT, RTR, RTS, SQD, ERR or RESET"),
            ));
        }
        None => return Err(ApiError::bad("bad_attr", "state is required")),
    };
    blocking(move || {
        let ty = s.rdma.qp_type(qpn)?;
        if let Some(x) = b.foreign(ty) {
            return Err(ApiError::bad(
                "bad_attr",
                format!("{x} is not an attribute of a {} QP", ty.name()),
            ));
        }
        let r = attr_request(&b, state == QpState::Rtr && ty == QpType::Rc)?;
        s.rdma.modify_qp(qpn, state, &r)?;
        s.rdma.query_qp(qpn)
    })
    .await
    .and_then(|(l, q)| ok(qp_json(l, &q, qpn)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CcBody {
    #[serde(default)]
    cc: Option<String>,
    #[serde(default)]
    cc_profile: Option<String>,
    #[serde(default)]
    dcqcn: Option<serde_json::Map<String, Value>>,
}

/// Changes a QP's congestion control at run time: its kind (a new kind starts at the line
/// rate), a profile, and knobs over the QP's current settings (or the profile's).
async fn qp_set_cc(State(s): State<Arc<ApiState>>, Path(q): Path<String>, b: Bytes) -> Reply {
    let qpn = id32("QPN", &q)?;
    let b: CcBody = body(&b)?;
    let kind: Option<CcKind> =
        b.cc.as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|e: &str| ApiError::bad("bad_cc", e))?;
    let profile = b.cc_profile.as_deref().map(profile_params).transpose()?;
    blocking(move || {
        let (_, now) = s.rdma.query_qp(qpn)?;
        let params = with_knobs(profile.unwrap_or(now.cc_params), b.dcqcn.as_ref())?;
        s.rdma.set_cc(qpn, kind, params)?;
        s.rdma.query_qp(qpn)
    })
    .await
    .and_then(|(l, q)| ok(qp_json(l, &q, qpn)))
}

#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct SgeBody {
    addr: u64,
    length: u32,
    lkey: u32,
}

fn sg_list(v: &[SgeBody]) -> Result<SgList, ApiError> {
    if v.len() > MAX_SGE {
        return Err(ApiError::bad(
            "bad_wr",
            format!("at most {MAX_SGE} SG entries"),
        ));
    }
    Ok(v.iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendBody {
    opcode: String,
    #[serde(default)]
    wr_id: u64,
    #[serde(default)]
    sge: Vec<SgeBody>,
    #[serde(default)]
    remote_addr: Option<u64>,
    #[serde(default)]
    rkey: Option<u32>,
    #[serde(default)]
    imm: Option<u32>,
    #[serde(default)]
    compare: Option<u64>,
    #[serde(default)]
    swap: Option<u64>,
    #[serde(default)]
    add: Option<u64>,
    #[serde(default = "yes")]
    signaled: bool,
    #[serde(default)]
    solicited: bool,
    #[serde(default)]
    fence: bool,
    /// IBV_SEND_INLINE: the SG list's bytes are copied at post time.
    #[serde(default)]
    inline: bool,
    /// Where a UD QP's send goes.
    #[serde(default)]
    ud: Option<UdBody>,
    // For the stream endpoint only.
    #[serde(default)]
    count: Option<u64>,
    #[serde(default)]
    depth: Option<usize>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    duration_ms: Option<u64>,
}

/// A UD send's destination: verbs' address handle (a GID), remote QPN and Q_Key.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UdBody {
    remote_gid: String,
    remote_qpn: u32,
    remote_qkey: u32,
}

/// The destination `b` names for a send on `qpn`, resolved (ARP/ND as for a connect); None
/// without one (RC sends, and UD sends the QP refuses as lacking it).
fn ud_dest(s: &ApiState, qpn: u32, b: &SendBody) -> Result<Option<UdDest>, ApiError> {
    let Some(u) = &b.ud else {
        return Ok(None);
    };
    let gid = parse_gid(&u.remote_gid)?;
    s.rdma
        .ud_dest(qpn, gid, u.remote_qpn, u.remote_qkey)
        .map(Some)
}

/// How long a test on the lcore runs: so many messages or iterations, or so long.
enum RunLength {
    Count(u64),
    Duration(Duration),
}

/// Exactly one of `count` (the body's field `name`, 1 to `max`) and `duration_ms` (1 ms to
/// 10 minutes, perftest's -D); anything else is a bad request with `code`.
fn count_or_duration(
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
fn stream_limits(
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

fn yes() -> bool {
    true
}

/// The opcodes a send work request may have, as the API spells them.
pub const OPCODES: [&str; 8] = [
    "send",
    "send-imm",
    "send-inv",
    "write",
    "write-imm",
    "read",
    "cmp-swap",
    "fetch-add",
];

fn send_wr(b: &SendBody) -> Result<SendWr, ApiError> {
    let need = |name: &str, v: Option<u64>| {
        v.ok_or_else(|| ApiError::bad("bad_wr", format!("opcode {} needs {name}", b.opcode)))
    };
    let remote = || -> Result<(u64, u32), ApiError> {
        Ok((
            need("remote_addr", b.remote_addr)?,
            need("rkey", b.rkey.map(u64::from))? as u32,
        ))
    };
    let op = match b.opcode.as_str() {
        "send" => SendOp::Send,
        "send-imm" => SendOp::SendWithImm(need("imm", b.imm.map(u64::from))? as u32),
        "send-inv" => SendOp::SendWithInv(need("rkey", b.rkey.map(u64::from))? as u32),
        "write" => {
            let (remote_addr, rkey) = remote()?;
            SendOp::Write { remote_addr, rkey }
        }
        "write-imm" => {
            let (remote_addr, rkey) = remote()?;
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: need("imm", b.imm.map(u64::from))? as u32,
            }
        }
        "read" => {
            let (remote_addr, rkey) = remote()?;
            SendOp::Read { remote_addr, rkey }
        }
        "cmp-swap" => {
            let (remote_addr, rkey) = remote()?;
            SendOp::CmpSwap {
                remote_addr,
                rkey,
                compare: need("compare", b.compare)?,
                swap: need("swap", b.swap)?,
            }
        }
        "fetch-add" => {
            let (remote_addr, rkey) = remote()?;
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: need("add", b.add)?,
            }
        }
        o => {
            return Err(ApiError::bad(
                "bad_wr",
                format!("unknown opcode {o:?}: use one of {}", OPCODES.join(", ")),
            ));
        }
    };
    Ok(SendWr {
        wr_id: b.wr_id,
        op,
        sg: sg_list(&b.sge)?,
        signaled: b.signaled,
        solicited: b.solicited,
        fence: b.fence,
        inline: b.inline,
        ud: None,
    })
}

async fn qp_send(State(s): State<Arc<ApiState>>, Path(q): Path<String>, b: Bytes) -> Reply {
    let qpn = id32("QPN", &q)?;
    let b: SendBody = body(&b)?;
    if b.count.is_some() || b.depth.is_some() || b.timeout_ms.is_some() || b.duration_ms.is_some() {
        return Err(ApiError::bad(
            "bad_wr",
            "count, depth, timeout_ms and duration_ms belong to /stream",
        ));
    }
    let mut wr = send_wr(&b)?;
    let wr_id = b.wr_id;
    blocking(move || {
        wr.ud = ud_dest(&s, qpn, &b)?;
        s.rdma.post_send(qpn, wr)
    })
    .await?;
    ok(json!({"posted": true, "wr_id": wr_id}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ByteRef {
    lkey: u32,
    addr: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LatBody {
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
struct BulkBody {
    count: usize,
    #[serde(default)]
    lcore: Option<usize>,
    #[serde(default)]
    max_send_wr: Option<u32>,
    #[serde(default)]
    max_recv_wr: Option<u32>,
    #[serde(default)]
    max_inline_data: Option<u32>,
    #[serde(default)]
    cc: Option<String>,
}

/// Most QPs one bulk request creates.
const MAX_BULK: usize = 200_000;

async fn qp_bulk_create(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: BulkBody = body(&b)?;
    if !(1..=MAX_BULK).contains(&b.count) {
        return Err(ApiError::bad(
            "bad_count",
            format!("count is 1 to {MAX_BULK}"),
        ));
    }
    let d = QpCaps::default();
    let caps = QpCaps {
        max_send_wr: b.max_send_wr.unwrap_or(d.max_send_wr),
        max_recv_wr: b.max_recv_wr.unwrap_or(d.max_recv_wr),
        max_inline_data: b.max_inline_data.unwrap_or(0),
        ..d
    };
    let cc: CcKind =
        b.cc.as_deref()
            .unwrap_or("dcqcn")
            .parse()
            .map_err(|e: &str| ApiError::bad("bad_cc", e))?;
    let params = DcqcnParams::nvidia();
    let (qpns, lcore) =
        blocking(move || s.rdma.create_qps(b.lcore, b.count, caps, cc, params)).await?;
    created(json!({"qpns": qpns, "lcore": lcore, "type": "RC", "state": "RESET"}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkPeer {
    qpn: u32,
    remote_qpn: u32,
    #[serde(default)]
    remote_psn: Option<u32>,
    #[serde(default)]
    local_psn: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkConnectBody {
    qps: Vec<BulkPeer>,
    attr: QpAttrBody,
}

async fn qp_bulk_connect(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: BulkConnectBody = body(&b)?;
    if b.qps.is_empty()
        || b.qps.len() > MAX_BULK
        || b.attr.state.is_some()
        || b.attr.foreign(QpType::Rc).is_some()
    {
        return Err(ApiError::bad(
            "bad_attr",
            format!("qps: 1 to {MAX_BULK}; attr: the attributes connect takes (no state)"),
        ));
    }
    if b.attr.remote_gid.is_none() {
        return Err(ApiError::bad("bad_attr", "attr.remote_gid is required"));
    }
    let base = attr_request(&b.attr, false)?;
    let list: Vec<(u32, ConnectRequest)> = b
        .qps
        .iter()
        .map(|p| {
            let mut r = base.clone();
            r.remote_qpn = p.remote_qpn;
            r.remote_psn = p.remote_psn;
            r.local_psn = p.local_psn;
            (p.qpn, r)
        })
        .collect();
    let n = list.len();
    blocking(move || s.rdma.connect_qps(&list)).await?;
    ok(json!({"connected": n}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkDestroyBody {
    qpns: Vec<u32>,
}

async fn qp_bulk_destroy(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: BulkDestroyBody = body(&b)?;
    if b.qpns.is_empty() || b.qpns.len() > MAX_BULK {
        return Err(ApiError::bad("bad_count", format!("qpns: 1 to {MAX_BULK}")));
    }
    let n = b.qpns.len();
    blocking(move || s.rdma.destroy_qps(&b.qpns)).await?;
    ok(json!({"destroyed": n}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamTarget {
    qpn: u32,
    #[serde(default)]
    remote_addr: Option<u64>,
    #[serde(default)]
    rkey: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamsBody {
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
}

async fn streams(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
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
    let wait = Duration::from_millis(wait_ms) + duration.unwrap_or_default();
    let r = blocking(move || s.rdma.streams(qps, count, depth, duration, wait)).await?;
    ok(
        json!({"completed": r.completed, "errors": r.errors, "elapsed_ns": r.elapsed_ns,
              "best_ns_per_wr": Some(r.best_ns_per_wr).filter(|b| b.is_finite())}),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecvStreamBody {
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
struct RecvStreamRun {
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

fn stream_result(r: dataplane::transport::perftest::StreamResult) -> Reply {
    let best = Some(r.best_ns_per_wr).filter(|b| b.is_finite());
    ok(
        json!({"completed": r.completed, "errors": r.errors, "elapsed_ns": r.elapsed_ns,
              "best_ns_per_wr": best}),
    )
}

async fn qp_recv_stream(State(s): State<Arc<ApiState>>, Path(q): Path<String>, b: Bytes) -> Reply {
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

async fn recv_streams(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
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
const MAX_LAT_ITERS: u64 = 1_000_000;

async fn qp_latency(State(s): State<Arc<ApiState>>, Path(q): Path<String>, b: Bytes) -> Reply {
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
        s.rdma
            .latency_test(qpn, kind, wr, iters, duration, server, wait)
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

async fn qp_stream(State(s): State<Arc<ApiState>>, Path(q): Path<String>, b: Bytes) -> Reply {
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
    let wait = Duration::from_millis(wait_ms) + duration.unwrap_or_default();
    let mut wr = wr;
    let r = blocking(move || {
        wr.ud = ud_dest(&s, qpn, &b)?;
        s.rdma.stream(qpn, wr, count, depth, duration, wait)
    })
    .await?;
    let best = Some(r.best_ns_per_wr).filter(|b| b.is_finite());
    ok(
        json!({"completed": r.completed, "errors": r.errors, "elapsed_ns": r.elapsed_ns,
              "best_ns_per_wr": best}),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecvBody {
    #[serde(default)]
    wr_id: u64,
    #[serde(default)]
    sge: Vec<SgeBody>,
}

async fn qp_recv(State(s): State<Arc<ApiState>>, Path(q): Path<String>, b: Bytes) -> Reply {
    let qpn = id32("QPN", &q)?;
    let b: RecvBody = body(&b)?;
    let wr = RecvWr {
        wr_id: b.wr_id,
        sg: sg_list(&b.sge)?,
    };
    blocking(move || s.rdma.post_recv(qpn, wr)).await?;
    ok(json!({"posted": true, "wr_id": b.wr_id}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PollQuery {
    #[serde(default)]
    max: Option<usize>,
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// A poll's `max` (default 16) and wait, checked.
fn poll_limits(p: PollQuery) -> Result<(usize, Duration), ApiError> {
    let max = p.max.unwrap_or(16);
    let wait_ms = p.wait_ms.unwrap_or(0);
    if !(1..=4096).contains(&max) || wait_ms > 30_000 {
        return Err(ApiError::bad(
            "bad_query",
            "max is 1 to 4096 and wait_ms at most 30000",
        ));
    }
    Ok((max, Duration::from_millis(wait_ms)))
}

fn wc_json(c: &WorkCompletion) -> Value {
    json!({"wr_id": c.wr_id, "status": wc_status_name(c.status),
           "opcode": wc_opcode_name(c.opcode), "byte_len": c.byte_len,
           "imm_data": c.imm_data, "invalidated_rkey": c.invalidated_rkey, "qp_num": c.qp_num,
           "src_qp": c.src_qp})
}

async fn qp_poll(
    State(s): State<Arc<ApiState>>,
    Path(q): Path<String>,
    p: Result<Query<PollQuery>, QueryRejection>,
) -> Reply {
    let qpn = id32("QPN", &q)?;
    let (max, wait) = poll_limits(query(p)?)?;
    let (sc, rc) = blocking(move || s.rdma.poll_cq(qpn, max, wait)).await?;
    ok(json!({"send": sc.iter().map(wc_json).collect::<Vec<_>>(),
              "recv": rc.iter().map(wc_json).collect::<Vec<_>>()}))
}

/// Prometheus exposition of the node's counters (see [`crate::metrics`]).
async fn metrics(State(s): State<Arc<ApiState>>) -> Reply {
    let s2 = s.clone();
    let (hosts, latency) = blocking(move || Ok((s.rdma.counters()?, s.rdma.latency()?))).await?;
    let text = crate::metrics::render(&s2, &hosts, &latency)
        .map_err(|e| ApiError::internal("internal", format!("metrics: {e}")))?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

async fn stats(State(s): State<Arc<ApiState>>) -> Reply {
    let s2 = s.clone();
    let c = blocking(move || s.rdma.counters()).await?;
    let lcores: Vec<Value> = c
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let mut m = crate::rdma::host_counters_json(h);
            if let Some(lc) = s2.lcore_counters.get(i) {
                for (k, v) in lc.snapshot() {
                    m.insert(k.to_string(), json!(v));
                }
            }
            json!({"lcore": i, "counters": m})
        })
        .collect();
    ok(json!({"lcores": lcores}))
}

/// Serves the API on `listener` until `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ApiState>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(stop)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Opt {
        #[serde(default)]
        a: Option<u32>,
    }

    #[test]
    fn a_body_is_a_json_object_or_empty() {
        let ok = |s: &'static str| body::<Opt>(&Bytes::from_static(s.as_bytes())).map(|o| o.a);
        assert_eq!(ok("").unwrap(), None, "no body: all defaults");
        assert_eq!(ok(" {\"a\": 3}").unwrap(), Some(3));
        for bad in ["[]", "[3]", "null", "3", "\"{}\"", " [ ]"] {
            let e = ok(bad).unwrap_err();
            assert_eq!((e.status, e.code), (400, "bad_body"), "{bad}");
        }
    }

    #[test]
    fn the_bearer_scheme_is_matched_without_regard_to_case() {
        for v in ["Bearer t0k", "bearer t0k", "BEARER t0k", "Bearer   t0k"] {
            assert_eq!(bearer_credentials(v), Some("t0k"), "{v}");
        }
        for v in ["Basic t0k", "Bearert0k", "t0k", ""] {
            assert_eq!(bearer_credentials(v), None, "{v}");
        }
    }
}
