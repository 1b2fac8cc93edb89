//! Protection domains.

use super::*;

pub(super) async fn pd_alloc(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
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

pub(super) async fn pd_list(State(s): State<Arc<ApiState>>) -> Reply {
    ok(json!(s.rdma.list_pds()))
}

pub(super) async fn pd_show(State(s): State<Arc<ApiState>>, Path(p): Path<String>) -> Reply {
    let pdn = id32("PD", &p)?;
    ok(json!(s.rdma.show_pd(pdn)?))
}

pub(super) async fn pd_dealloc(State(s): State<Arc<ApiState>>, Path(p): Path<String>) -> Reply {
    let pdn = id32("PD", &p)?;
    blocking(move || s.rdma.dealloc_pd(pdn)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
