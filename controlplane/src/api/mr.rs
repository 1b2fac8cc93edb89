//! Memory regions and their bytes.

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MrBody {
    length: u64,
    #[serde(default)]
    pd: Option<u32>,
    #[serde(default)]
    access: Vec<String>,
    #[serde(default)]
    addr: Option<u64>,
}

pub(super) async fn mr_reg(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: MrBody = body(&b)?;
    let access = parse_access(&b.access)?;
    let len = usize::try_from(b.length)
        .map_err(|_| ApiError::bad("bad_length", "length is too large"))?;
    let info = blocking(move || s.rdma.reg_mr(len, access, b.addr, b.pd)).await?;
    created(json!(info))
}

pub(super) async fn mr_list(State(s): State<Arc<ApiState>>) -> Reply {
    ok(json!(s.rdma.list_mrs()))
}

pub(super) async fn mr_show(State(s): State<Arc<ApiState>>, Path(k): Path<String>) -> Reply {
    ok(json!(s.rdma.show_mr(id32("key", &k)?)?))
}

pub(super) async fn mr_dereg(State(s): State<Arc<ApiState>>, Path(k): Path<String>) -> Reply {
    let key = id32("key", &k)?;
    blocking(move || s.rdma.dereg_mr(key)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DataQuery {
    #[serde(default)]
    addr: Option<u64>,
    #[serde(default)]
    length: Option<u64>,
}

pub(super) async fn mr_read(
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

pub(super) async fn mr_write(
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
