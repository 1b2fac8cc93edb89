//! RDMA CM: listeners, connects and accepts over QP1, and the connections they made.

use super::*;
use crate::rdma::{CmSpace, MAX_BACKLOG};

/// The longest a connect or accept waits for its peer (the documented limit).
pub const MAX_CM_WAIT_MS: u64 = 30_000;
const DEFAULT_CM_WAIT_MS: u64 = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListenBody {
    port: u16,
    #[serde(default)]
    backlog: Option<usize>,
    #[serde(default)]
    space: CmSpace,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SpaceQuery {
    #[serde(default)]
    space: CmSpace,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectBody {
    qpn: u32,
    peer: String,
    port: u16,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcceptBody {
    port: u16,
    qpn: u32,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    space: CmSpace,
    /// A request waiting on the port (its connection ID) instead of the oldest.
    #[serde(default)]
    id: Option<u32>,
}

fn wait_of(ms: Option<u64>) -> Result<Duration, ApiError> {
    match ms.unwrap_or(DEFAULT_CM_WAIT_MS) {
        ms if ms > MAX_CM_WAIT_MS => Err(ApiError::bad(
            "bad_timeout",
            format!("timeout_ms must be at most {MAX_CM_WAIT_MS}"),
        )),
        ms => Ok(Duration::from_millis(ms)),
    }
}

fn port16(s: &str) -> Result<u16, ApiError> {
    let n = number("port", s)?;
    u16::try_from(n).map_err(|_| ApiError::bad("bad_path", format!("port {s} is past 65535")))
}

pub(super) async fn cm_listen(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: ListenBody = body(&b)?;
    let backlog = b.backlog.unwrap_or(128);
    if backlog == 0 || backlog > MAX_BACKLOG {
        return Err(ApiError::bad(
            "bad_backlog",
            format!("backlog must be 1 to {MAX_BACKLOG}"),
        ));
    }
    let l = blocking(move || s.rdma.cm_listen(b.port, b.space, backlog)).await?;
    created(json!(l))
}

pub(super) async fn cm_listeners(State(s): State<Arc<ApiState>>) -> Reply {
    ok(json!(s.rdma.cm_listeners()))
}

pub(super) async fn cm_unlisten(
    State(s): State<Arc<ApiState>>,
    Path(p): Path<String>,
    q: Result<Query<SpaceQuery>, QueryRejection>,
) -> Reply {
    let port = port16(&p)?;
    let space = query(q)?.space;
    blocking(move || s.rdma.cm_unlisten(port, space)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn cm_connect(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: ConnectBody = body(&b)?;
    let peer = parse_gid(&b.peer)?;
    let wait = wait_of(b.timeout_ms)?;
    let c = blocking(move || s.rdma.cm_connect(b.qpn, peer, b.port, wait)).await?;
    created(json!(c))
}

pub(super) async fn cm_accept(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: AcceptBody = body(&b)?;
    let wait = wait_of(b.timeout_ms)?;
    let c = blocking(move || s.rdma.cm_accept((b.port, b.space, b.id), b.qpn, wait)).await?;
    created(json!(c))
}

/// A UD service's QP by SIDR (rdma_cm's UDP port space): the body of a connect.
pub(super) async fn cm_resolve(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: ConnectBody = body(&b)?;
    let peer = parse_gid(&b.peer)?;
    let wait = wait_of(b.timeout_ms)?;
    let c = blocking(move || s.rdma.cm_resolve(b.qpn, peer, b.port, wait)).await?;
    created(json!(c))
}

pub(super) async fn cm_connections(State(s): State<Arc<ApiState>>) -> Reply {
    ok(json!(s.rdma.cm_connections()))
}

pub(super) async fn cm_connection(State(s): State<Arc<ApiState>>, Path(p): Path<String>) -> Reply {
    let id = id32("connection", &p)?;
    ok(json!(s.rdma.cm_connection(id)?))
}

pub(super) async fn cm_disconnect(State(s): State<Arc<ApiState>>, Path(p): Path<String>) -> Reply {
    let id = id32("connection", &p)?;
    let c = blocking(move || s.rdma.cm_disconnect(id)).await?;
    ok(json!(c))
}
