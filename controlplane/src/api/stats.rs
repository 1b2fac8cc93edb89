//! Ports, statistics and the Prometheus exposition.

use super::*;

/// The ports' view with each port's GID table added.
pub(super) fn ports_with_gids(s: &ApiState) -> Vec<Value> {
    let mut v = s.ports.lock().expect("ports").clone();
    for (i, p) in v.iter_mut().enumerate() {
        let gids: Vec<String> = s.rdma.gids(i).iter().map(|g| g.to_string()).collect();
        p["gids"] = json!(gids);
    }
    v
}

pub(super) async fn ports(State(s): State<Arc<ApiState>>) -> Reply {
    ok(Value::Array(ports_with_gids(&s)))
}

pub(super) async fn port_show(State(s): State<Arc<ApiState>>, Path(p): Path<String>) -> Reply {
    let i = port_index(&s, &p)?;
    ports_with_gids(&s)
        .get(i)
        .cloned()
        .map(ok)
        .unwrap_or_else(|| Err(ApiError::not_found(format!("no port {i}"))))
}

/// Prometheus exposition of the node's counters (see [`crate::metrics`]).
pub(super) async fn metrics(State(s): State<Arc<ApiState>>) -> Reply {
    let s2 = s.clone();
    let (hosts, latency, apps) = blocking(move || {
        Ok::<_, ApiError>((s.rdma.counters()?, s.rdma.latency()?, s.app_listings()?))
    })
    .await?;
    let text = crate::metrics::render(&s2, &hosts, &latency, &apps)
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

pub(super) async fn stats(State(s): State<Arc<ApiState>>) -> Reply {
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
