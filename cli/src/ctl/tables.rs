//! What rocectl prints for people: tables of ports, regions, PDs, CQs and QPs, and the
//! formatting helpers they share.

use super::*;

/// A printer of a list of the API's objects as a table.
pub(super) type Table = fn(&mut dyn Write, &[Value]) -> std::io::Result<()>;

/// Prints `v` (one object or a list) with `table` unless --json; whether it printed.
pub(super) fn as_table(
    v: &Value,
    json: bool,
    out: &mut dyn Write,
    table: Table,
) -> Result<bool, Fail> {
    if json || v.is_null() {
        return Ok(false);
    }
    let list = v.as_array().cloned().unwrap_or_else(|| vec![v.clone()]);
    table(out, &list).map_err(|e| Fail(2, e.to_string()))?;
    Ok(true)
}

/// A JSON object of the fields that are set (options left out rather than sent as null).
pub(super) fn object(fields: &[(&str, Value)]) -> Value {
    Value::Object(
        fields
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

pub(super) fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => "-".into(),
        x => x.to_string(),
    }
}

pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(super) fn hex_spaced(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn unhex(s: &str) -> Result<Vec<u8>, String> {
    let d: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !d.len().is_multiple_of(2) {
        return Err("--hex needs an even number of hex digits".into());
    }
    d.chunks(2)
        .map(|p| {
            let t = std::str::from_utf8(p).unwrap_or("zz");
            u8::from_str_radix(t, 16).map_err(|_| format!("{t:?} in --hex is not hex"))
        })
        .collect()
}

pub(super) fn table(
    out: &mut dyn Write,
    head: &[&str],
    rows: impl IntoIterator<Item = Vec<String>>,
) -> std::io::Result<()> {
    let rows: Vec<Vec<String>> = rows.into_iter().collect();
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    writeln!(out, "{}", line(head.to_vec()))?;
    for r in &rows {
        writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

pub(super) fn mr_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    table(
        out,
        &["key", "pdn", "addr", "length", "access"],
        list.iter().map(|m| {
            vec![
                m["lkey"].to_string(),
                s(&m["pdn"]),
                m["addr"].as_u64().map_or("-".into(), |a| format!("{a:#x}")),
                m["length"].to_string(),
                m["access"]
                    .as_array()
                    .map(|a| a.iter().map(s).collect::<Vec<_>>().join(","))
                    .unwrap_or_default(),
            ]
        }),
    )
}

pub(super) fn app_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    let many = |v: &Value| {
        let a = v.as_array().map_or(&[][..], Vec::as_slice);
        if a.is_empty() {
            "-".to_string()
        } else {
            a.iter().map(s).collect::<Vec<_>>().join(",")
        }
    };
    table(
        out,
        &[
            "pid",
            "command",
            "qps",
            "mrs",
            "cqs",
            "pds",
            "ahs",
            "sends",
            "recvs",
            "completions",
            "errors",
        ],
        list.iter().map(|a| {
            let c = &a["counters"];
            let errors =
                c["refused"].as_u64().unwrap_or(0) + c["broken_rings"].as_u64().unwrap_or(0);
            vec![
                s(&a["pid"]),
                s(&a["command"]),
                many(&a["qps"]),
                many(&a["mrs"]),
                s(&a["cqs"]),
                many(&a["pds"]),
                s(&a["ahs"]),
                s(&c["sends"]),
                s(&c["recvs"]),
                s(&c["completions"]),
                errors.to_string(),
            ]
        }),
    )
}

pub(super) fn pd_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    table(
        out,
        &["pdn", "mrs", "qps"],
        list.iter()
            .map(|p| vec![s(&p["pdn"]), s(&p["mrs"]), s(&p["qps"])]),
    )
}

pub(super) fn cq_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    table(
        out,
        &["cqn", "lcore", "cqe", "waiting", "users", "state"],
        list.iter().map(|q| {
            vec![
                s(&q["cqn"]),
                s(&q["lcore"]),
                s(&q["cqe"]),
                s(&q["waiting"]),
                s(&q["users"]),
                if q["in_error"] == true {
                    "overflowed"
                } else {
                    "ok"
                }
                .into(),
            ]
        }),
    )
}

pub(super) fn qp_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    table(
        out,
        &[
            "lqpn", "rqpn", "type", "state", "sq-psn", "rq-psn", "pdn", "lcore", "path-mtu", "cc",
        ],
        list.iter().map(|q| {
            vec![
                q["lqpn"].to_string(),
                s(&q["rqpn"]),
                s(&q["type"]),
                s(&q["state"]),
                s(&q["sq-psn"]),
                s(&q["rq-psn"]),
                s(&q["pdn"]),
                s(&q["lcore"]),
                s(&q["path-mtu"]),
                s(&q["cc"]["kind"]),
            ]
        }),
    )
}

pub(super) fn cm_listener_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    table(
        out,
        &["port", "space", "service-id", "backlog", "waiting"],
        list.iter().map(|l| {
            vec![
                s(&l["port"]),
                s(&l["space"]),
                s(&l["service_id"]),
                s(&l["backlog"]),
                s(&l["waiting"]),
            ]
        }),
    )
}

pub(super) fn cm_table(out: &mut dyn Write, list: &[Value]) -> std::io::Result<()> {
    table(
        out,
        &[
            "id", "role", "space", "state", "port", "peer", "lqpn", "rqpn", "reason",
        ],
        list.iter().map(|c| {
            let peer = match (&c["peer"], c["peer_port"].as_u64()) {
                (Value::String(p), Some(pp)) if c["role"] == "passive" && p.contains(':') => {
                    format!("[{p}]:{pp}")
                }
                (Value::String(p), Some(pp)) if c["role"] == "passive" => format!("{p}:{pp}"),
                (p, _) => s(p),
            };
            vec![
                s(&c["id"]),
                s(&c["role"]),
                s(&c["space"]),
                s(&c["state"]),
                s(&c["port"]),
                peer,
                s(&c["qpn"]),
                s(&c["remote_qpn"]),
                s(&c["reject_reason"]),
            ]
        }),
    )
}
