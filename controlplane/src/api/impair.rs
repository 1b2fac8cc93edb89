//! The impairment stages of the ports.

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CongestionBody {
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
pub(super) struct ImpairBody {
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

pub(super) fn port_index(s: &ApiState, p: &str) -> Result<usize, ApiError> {
    let i = number("port", p)? as usize;
    if i >= s.impair.len() {
        return Err(ApiError::not_found(format!(
            "no port {i}: this node has {} port(s)",
            s.impair.len()
        )));
    }
    Ok(i)
}

pub(super) async fn impair_set(
    State(s): State<Arc<ApiState>>,
    Path(p): Path<String>,
    b: Bytes,
) -> Reply {
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

pub(super) async fn impair_show(State(s): State<Arc<ApiState>>, Path(p): Path<String>) -> Reply {
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
