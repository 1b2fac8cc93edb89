//! Queue pairs: create, list, show, destroy, connect, modify, congestion control, in bulk.

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct QpBody {
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

pub(super) fn qp_type_of(name: Option<&str>) -> Result<QpType, ApiError> {
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
pub(super) fn dcqcn_params(
    profile: &str,
    knobs: Option<&serde_json::Map<String, Value>>,
) -> Result<DcqcnParams, ApiError> {
    with_knobs(profile_params(profile)?, knobs)
}

pub(super) fn profile_params(profile: &str) -> Result<DcqcnParams, ApiError> {
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
pub(super) fn with_knobs(
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

pub(super) async fn qp_create(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
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

pub(super) fn qp_json(lcore: usize, q: &dataplane::transport::device::QpQuery, qpn: u32) -> Value {
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

pub(super) async fn qp_list(State(s): State<Arc<ApiState>>) -> Reply {
    let v = blocking(move || {
        let qps = s.rdma.list_qps()?;
        Ok::<_, ApiError>(qps.iter().map(|(qpn, l, q)| qp_json(*l, q, *qpn)).collect())
    })
    .await?;
    ok(Value::Array(v))
}

pub(super) async fn qp_show(State(s): State<Arc<ApiState>>, Path(q): Path<String>) -> Reply {
    let qpn = id32("QPN", &q)?;
    let (l, q) = blocking(move || s.rdma.query_qp(qpn)).await?;
    ok(qp_json(l, &q, qpn))
}

pub(super) async fn qp_destroy(State(s): State<Arc<ApiState>>, Path(q): Path<String>) -> Reply {
    let qpn = id32("QPN", &q)?;
    blocking(move || s.rdma.destroy_qp(qpn)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) fn default_access() -> Vec<String> {
    ["remote-write", "remote-read", "remote-atomic"]
        .map(String::from)
        .to_vec()
}

/// A QP's attributes, for connect (RESET to RTS at once) and modify (one state at a time).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct QpAttrBody {
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

/// The attributes checked, as the engine's [`QpAttr`], with the defaults `rdma_rxe`/perftest
/// use where absent: the remote GID and DSCP as the path it names ([`Path::toward`], resolved
/// by the node), `max_rd_atomic` for both directions. The remote QPN and GID are required
/// when `need_remote`. `state` is the body's (modify) or RTS (connect).
pub(super) fn attr_request(
    b: &QpAttrBody,
    state: QpState,
    need_remote: bool,
) -> Result<QpAttr, ApiError> {
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
    if need_remote && b.remote_qpn.is_none() {
        return Err(missing("remote_qpn"));
    }
    if need_remote && b.remote_gid.is_none() {
        return Err(missing("remote_gid"));
    }
    let dscp = check("dscp", b.dscp, 63, 26)?;
    let max_rd_atomic = check(
        "max_rd_atomic",
        b.max_rd_atomic,
        dataplane::transport::qp::MAX_RD_ATOMIC,
        dataplane::transport::qp::DEFAULT_RD_ATOMIC,
    )?;
    Ok(QpAttr {
        state: Some(state),
        access: Some(parse_access(
            b.access.as_deref().unwrap_or(&default_access()),
        )?),
        pkey_index: Some(0),
        path_mtu: Some(mtu),
        dest_qp: b.remote_qpn,
        rq_psn: b.remote_psn,
        sq_psn: b.local_psn,
        timeout: Some(check("timeout", b.timeout, 31, 14)?),
        retry_cnt: Some(check("retry_cnt", b.retry_cnt, 7, 7)?),
        rnr_retry: Some(check("rnr_retry", b.rnr_retry, 7, 7)?),
        min_rnr_timer: Some(check("min_rnr_timer", b.min_rnr_timer, 31, 1)?),
        max_rd_atomic: Some(max_rd_atomic),
        max_dest_rd_atomic: Some(max_rd_atomic),
        path: match &b.remote_gid {
            Some(g) => Some(TransportPath::toward(parse_gid(g)?, dscp)),
            None => None,
        },
        qkey: b.qkey,
    })
}

pub(super) async fn qp_connect(
    State(s): State<Arc<ApiState>>,
    Path(q): Path<String>,
    b: Bytes,
) -> Reply {
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
        let a = attr_request(&b, QpState::Rts, true)?;
        s.rdma.connect_qp(qpn, &a)?;
        Ok::<_, ApiError>(s.rdma.query_qp(qpn)?)
    })
    .await
    .and_then(|(l, q)| ok(qp_json(l, &q, qpn)))
}

/// One verbs transition: to INIT (access), RTR (remote QPN and GID, its first PSN, MTU,
/// min_rnr_timer, max_rd_atomic as responder), RTS (our first PSN, timeout, retry_cnt,
/// rnr_retry, max_rd_atomic), or SQD, ERR, RESET; attributes a transition does not take are
/// refused by the QP's state machine as verbs refuses them.
pub(super) async fn qp_modify(
    State(s): State<Arc<ApiState>>,
    Path(q): Path<String>,
    b: Bytes,
) -> Reply {
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
        let a = attr_request(&b, state, state == QpState::Rtr && ty == QpType::Rc)?;
        s.rdma.modify_qp(qpn, &a, b.port.unwrap_or(0))?;
        Ok::<_, ApiError>(s.rdma.query_qp(qpn)?)
    })
    .await
    .and_then(|(l, q)| ok(qp_json(l, &q, qpn)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CcBody {
    #[serde(default)]
    cc: Option<String>,
    #[serde(default)]
    cc_profile: Option<String>,
    #[serde(default)]
    dcqcn: Option<serde_json::Map<String, Value>>,
}

/// Changes a QP's congestion control at run time: its kind (a new kind starts at the line
/// rate), a profile, and knobs over the QP's current settings (or the profile's).
pub(super) async fn qp_set_cc(
    State(s): State<Arc<ApiState>>,
    Path(q): Path<String>,
    b: Bytes,
) -> Reply {
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
        Ok::<_, ApiError>(s.rdma.query_qp(qpn)?)
    })
    .await
    .and_then(|(l, q)| ok(qp_json(l, &q, qpn)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BulkBody {
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

/// Most QPs one bulk request creates, connects, destroys or streams on: an lcore's worth.
pub const MAX_BULK: usize = 1 << 20;

pub(super) async fn qp_bulk_create(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
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
pub(super) struct BulkPeer {
    qpn: u32,
    remote_qpn: u32,
    #[serde(default)]
    remote_psn: Option<u32>,
    #[serde(default)]
    local_psn: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BulkConnectBody {
    qps: Vec<BulkPeer>,
    attr: QpAttrBody,
}

pub(super) async fn qp_bulk_connect(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
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
    let base = attr_request(&b.attr, QpState::Rts, false)?;
    let list: Vec<(u32, QpAttr)> = b
        .qps
        .iter()
        .map(|p| {
            let a = QpAttr {
                dest_qp: Some(p.remote_qpn),
                rq_psn: p.remote_psn,
                sq_psn: p.local_psn,
                ..base
            };
            (p.qpn, a)
        })
        .collect();
    let n = list.len();
    blocking(move || s.rdma.connect_qps(&list)).await?;
    ok(json!({"connected": n}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BulkDestroyBody {
    qpns: Vec<u32>,
}

pub(super) async fn qp_bulk_destroy(State(s): State<Arc<ApiState>>, b: Bytes) -> Reply {
    let b: BulkDestroyBody = body(&b)?;
    if b.qpns.is_empty() || b.qpns.len() > MAX_BULK {
        return Err(ApiError::bad("bad_count", format!("qpns: 1 to {MAX_BULK}")));
    }
    let n = b.qpns.len();
    blocking(move || s.rdma.destroy_qps(&b.qpns)).await?;
    ok(json!({"destroyed": n}))
}
