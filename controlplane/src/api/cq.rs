//! Completion queues.

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CqBody {
    cqe: u64,
    #[serde(default)]
    lcore: Option<usize>,
}

pub(super) async fn cq_create(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: CqBody = body(&b)?;
    let cqe = usize::try_from(b.cqe).unwrap_or(usize::MAX);
    let cq = blocking(move || s.rdma.create_cq(cqe, b.lcore)).await?;
    created(json!(cq))
}

pub(super) async fn cq_list(State(s): State<Arc<ApiState>>) -> Reply {
    let v = blocking(move || s.rdma.list_cqs()).await?;
    ok(json!(v))
}

pub(super) async fn cq_show(State(s): State<Arc<ApiState>>, Path(c): Path<String>) -> Reply {
    let cqn = id32("CQN", &c)?;
    let (_, info) = blocking(move || s.rdma.poll_cqn(cqn, 0, Duration::ZERO)).await?;
    ok(json!(info))
}

pub(super) async fn cq_destroy(State(s): State<Arc<ApiState>>, Path(c): Path<String>) -> Reply {
    let cqn = id32("CQN", &c)?;
    blocking(move || s.rdma.destroy_cq(cqn)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn cq_poll(
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
