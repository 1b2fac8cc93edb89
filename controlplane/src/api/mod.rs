//! roced's REST API, versioned under `/v1`, on a thread of its own (never a dataplane lcore).
//!
//! Handlers parse and check the request whole, then run the operation on tokio's blocking
//! pool, where [`Rdma`] sends commands to the lcores and waits for their replies. Errors are
//! JSON, `{"code": "...", "message": "..."}`, with a 4xx status for the caller's mistakes and
//! 5xx for the node's. Request bodies are JSON with unknown fields refused, except region data,
//! which is raw bytes (`application/octet-stream`).

use crate::rdma::{
    QpPlacement, access_names, parse_access, parse_gid, wc_opcode_name, wc_status_name,
};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dataplane::cc::{CcKind, DcqcnParams};
use dataplane::port::impair::{CongestionPoint, Direction, Impairments};
use dataplane::sim::Red;
use dataplane::transport::cq::WorkCompletion;
use dataplane::transport::perftest::{LatKind, Shape};
use dataplane::transport::qp::{Mtu, Path as TransportPath, QpAttr, QpState, QpType};
use dataplane::transport::rc::QpCaps;
use dataplane::transport::wr::{MAX_SGE, RecvWr, SendOp, SendWr, SgList, Sge, UdDest};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

mod cm;
mod cq;
mod error;
mod impair;
mod mr;
mod pd;
mod post;
mod qp;
mod stats;
mod traffic;

pub use crate::state::ApiState;
pub use cm::MAX_CM_WAIT_MS;
use cm::*;
use cq::*;
pub use error::ApiError;
use impair::*;
use mr::*;
use pd::*;
pub use post::OPCODES;
use post::*;
pub use qp::MAX_BULK;
use qp::*;
use stats::*;
use traffic::*;

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

/// Runs `f` (which waits on lcores) on tokio's blocking pool; its error as the API answers it.
async fn blocking<T: Send + 'static, E: Into<ApiError> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal("internal", format!("the operation failed: {e}")))?
        .map_err(Into::into)
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
        .route("/v1/apps", get(apps))
        .route("/v1/cm/listeners", get(cm_listeners).post(cm_listen))
        .route(
            "/v1/cm/listeners/{port}",
            axum::routing::delete(cm_unlisten),
        )
        .route("/v1/cm/connect", post(cm_connect))
        .route("/v1/cm/accept", post(cm_accept))
        .route("/v1/cm/resolve", post(cm_resolve))
        .route("/v1/cm/connections", get(cm_connections))
        .route(
            "/v1/cm/connections/{id}",
            get(cm_connection).delete(cm_disconnect),
        )
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

/// Largest request body the API reads (axum's default is 2 MiB): a bulk request on
/// [`MAX_BULK`] QPs at about 100 bytes of JSON each.
pub const MAX_BODY: usize = 128 << 20;

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

/// The applications attached to the attach socket and what each made.
async fn apps(State(s): State<Arc<ApiState>>) -> Reply {
    let list = blocking(move || s.app_listings()).await?;
    ok(Value::Array(list.into_iter().map(|(v, _)| v).collect()))
}

async fn health(State(s): State<Arc<ApiState>>) -> Reply {
    ok(json!({"status": "ok", "lcores": s.rdma.lcores()}))
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
