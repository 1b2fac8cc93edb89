//! rocectl's commands over roced's REST API, in the style of iproute2's `rdma`: a noun, a verb,
//! tables for people and `--json` for scripts. [`run`] is the whole program minus the process
//! (arguments in, text out, an exit status back), so tests drive it in-process.
//!
//! Exit status: 0 on success; 1 when roced refused the request (the API's code and message are
//! printed); 2 for usage errors and when roced cannot be reached.

use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

mod args;
mod client;
mod tables;

pub use args::*;
pub(crate) use client::{Client, Fail};
use tables::*;

/// Runs rocectl with `args` (program name first), writing to `out` and `err`; the exit status.
pub fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = if code == 0 {
                write!(out, "{e}")
            } else {
                write!(err, "{e}")
            };
            return code;
        }
    };
    match execute(&cli, out) {
        Ok(code) => code,
        Err(Fail(code, msg)) => {
            let _ = writeln!(err, "rocectl: {msg}");
            code
        }
    }
}

fn execute(cli: &Cli, out: &mut dyn Write) -> Result<u8, Fail> {
    let c = Client::new(&cli.api, cli.token.as_deref());
    let io = |e: std::io::Error| Fail(2, e.to_string());
    let v = match &cli.cmd {
        Cmd::Decode { file, verify_icrc } => return decode(file, *verify_icrc, cli.json, out),
        Cmd::Perf(a) => return crate::perf::perf(&c, a, cli.json, out),
        Cmd::Pingpong(a) => return crate::pingpong::pingpong(&c, a, cli.json, out),
        Cmd::Rping(a) => return crate::rping::rping(&c, a, cli.json, out),
        Cmd::Udaddy(a) => return crate::udaddy::udaddy(&c, a, cli.json, out),
        Cmd::Ucmatose(a) => return crate::ucmatose::ucmatose(&c, a, cli.json, out),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "rocectl", out);
            return Ok(0);
        }
        Cmd::Port {
            verb: PortVerb::Show { port },
        } => {
            let v = match port {
                Some(p) => Value::Array(vec![c.call("GET", &format!("/v1/ports/{p}"), None)?]),
                None => c.call("GET", "/v1/ports", None)?,
            };
            if !cli.json {
                table(
                    out,
                    &[
                        "port", "device", "driver", "mac", "mtu", "link", "rx pkts", "tx pkts",
                    ],
                    v.as_array().into_iter().flatten().map(|p| {
                        vec![
                            p["port"].to_string(),
                            s(&p["device"]),
                            s(&p["driver"]),
                            s(&p["mac"]),
                            p["mtu"].to_string(),
                            if p["link_up"] == true { "up" } else { "down" }.into(),
                            p["ipackets"].to_string(),
                            p["opackets"].to_string(),
                        ]
                    }),
                )
                .map_err(io)?;
                return Ok(0);
            }
            v
        }
        Cmd::Pd { verb } => {
            let v = match verb {
                PdVerb::Create => c.call("POST", "/v1/pds", Some(json!({})))?,
                PdVerb::Show { pdn } => one_or_all(&c, "/v1/pds", *pdn)?,
                PdVerb::Destroy { pdn } => c.call("DELETE", &format!("/v1/pds/{pdn}"), None)?,
            };
            if as_table(&v, cli.json, out, pd_table)? {
                return Ok(0);
            }
            v
        }
        Cmd::Mr { verb } => match verb {
            MrVerb::Reg { size, access, pd } => {
                let v = c.call(
                    "POST",
                    "/v1/mrs",
                    Some(object(&[
                        ("length", json!(size)),
                        ("access", json!(access)),
                        ("pd", json!(pd)),
                    ])),
                )?;
                if as_table(&v, cli.json, out, mr_table)? {
                    return Ok(0);
                }
                v
            }
            MrVerb::Show { key } => {
                let v = one_or_all(&c, "/v1/mrs", *key)?;
                if as_table(&v, cli.json, out, mr_table)? {
                    return Ok(0);
                }
                v
            }
            MrVerb::Dereg { key } => c.call("DELETE", &format!("/v1/mrs/{key}"), None)?,
            MrVerb::Read { key, addr, length } => {
                let addr = match addr {
                    Some(a) => *a,
                    None => c.call("GET", &format!("/v1/mrs/{key}"), None)?["addr"]
                        .as_u64()
                        .unwrap_or(0),
                };
                let bytes = c.read_bytes(*key, addr, *length)?;
                if cli.json {
                    json!({"key": key, "addr": addr, "hex": hex(&bytes)})
                } else {
                    for (i, line) in bytes.chunks(16).enumerate() {
                        writeln!(out, "{:#018x}  {}", addr + i as u64 * 16, hex_spaced(line))
                            .map_err(io)?;
                    }
                    return Ok(0);
                }
            }
            MrVerb::Write { key, addr, hex } => {
                let bytes = unhex(hex).map_err(|e| Fail(2, e))?;
                let addr = match addr {
                    Some(a) => *a,
                    None => c.call("GET", &format!("/v1/mrs/{key}"), None)?["addr"]
                        .as_u64()
                        .unwrap_or(0),
                };
                c.write_bytes(*key, addr, &bytes)?;
                json!({"key": key, "addr": addr, "written": bytes.len()})
            }
        },
        Cmd::Qp { verb } => match verb {
            QpVerb::Create {
                qp_type,
                lcore,
                pd,
                cq,
                send_cq,
                recv_cq,
                cc,
                cc_profile,
                max_send_wr,
                max_recv_wr,
            } => {
                let b = object(&[
                    ("type", json!(qp_type)),
                    ("lcore", json!(lcore)),
                    ("pd", json!(pd)),
                    ("send_cq", json!(cq.or(*send_cq))),
                    ("recv_cq", json!(cq.or(*recv_cq))),
                    ("cc", json!(cc)),
                    ("cc_profile", json!(cc_profile)),
                    ("max_send_wr", json!(max_send_wr)),
                    ("max_recv_wr", json!(max_recv_wr)),
                ]);
                c.call("POST", "/v1/qps", Some(b))?
            }
            QpVerb::Connect {
                qpn,
                remote_qpn,
                remote_gid,
                remote_psn,
                local_psn,
                mtu,
                access,
            } => {
                let b = object(&[
                    ("remote_qpn", json!(remote_qpn)),
                    ("remote_gid", json!(remote_gid)),
                    ("remote_psn", json!(remote_psn)),
                    ("local_psn", json!(local_psn)),
                    ("mtu", json!(mtu)),
                    ("access", json!(access)),
                ]);
                c.call("POST", &format!("/v1/qps/{qpn}/connect"), Some(b))?;
                c.call("GET", &format!("/v1/qps/{qpn}"), None)?
            }
            QpVerb::Modify {
                qpn,
                state,
                remote_qpn,
                remote_gid,
                remote_psn,
                local_psn,
                mtu,
                access,
                qkey,
                port,
            } => {
                let b = object(&[
                    ("state", json!(state)),
                    ("qkey", json!(qkey)),
                    ("port", json!(port)),
                    ("remote_qpn", json!(remote_qpn)),
                    ("remote_gid", json!(remote_gid)),
                    ("remote_psn", json!(remote_psn)),
                    ("local_psn", json!(local_psn)),
                    ("mtu", json!(mtu)),
                    ("access", json!(access)),
                ]);
                c.call("POST", &format!("/v1/qps/{qpn}/modify"), Some(b))?
            }
            QpVerb::Show { qpn } => {
                let list = match qpn {
                    Some(q) => vec![c.call("GET", &format!("/v1/qps/{q}"), None)?],
                    None => c
                        .call("GET", "/v1/qps", None)?
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                };
                if cli.json {
                    Value::Array(list)
                } else {
                    qp_table(out, &list).map_err(io)?;
                    return Ok(0);
                }
            }
            QpVerb::Destroy { qpn } => c.call("DELETE", &format!("/v1/qps/{qpn}"), None)?,
        },
        Cmd::Post { verb } => {
            let (qpn, path, b) = post_body(verb);
            c.call("POST", &format!("/v1/qps/{qpn}/{path}"), Some(b))?
        }
        Cmd::Cq { verb } => match verb {
            CqVerb::Create { cqe, lcore } => {
                let v = c.call(
                    "POST",
                    "/v1/cqs",
                    Some(object(&[("cqe", json!(cqe)), ("lcore", json!(lcore))])),
                )?;
                if as_table(&v, cli.json, out, cq_table)? {
                    return Ok(0);
                }
                v
            }
            CqVerb::Show { cqn } => {
                let v = one_or_all(&c, "/v1/cqs", *cqn)?;
                if as_table(&v, cli.json, out, cq_table)? {
                    return Ok(0);
                }
                v
            }
            CqVerb::Destroy { cqn } => c.call("DELETE", &format!("/v1/cqs/{cqn}"), None)?,
            CqVerb::Poll {
                cqn,
                qp,
                max,
                wait_ms,
            } => {
                let q = format!("completions?max={max}&wait_ms={wait_ms}");
                let (v, sides) = match (cqn, qp) {
                    (_, Some(qpn)) => (
                        c.call("GET", &format!("/v1/qps/{qpn}/{q}"), None)?,
                        vec!["send", "recv"],
                    ),
                    (Some(cqn), None) => (
                        c.call("GET", &format!("/v1/cqs/{cqn}/{q}"), None)?,
                        vec!["completions"],
                    ),
                    (None, None) => return Err(Fail(2, "cq poll needs a CQN or --qp".into())),
                };
                if !cli.json {
                    let rows = sides.into_iter().flat_map(|side| {
                        v[side]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                            .into_iter()
                            .map(move |w| {
                                vec![
                                    if side == "completions" { "-" } else { side }.to_string(),
                                    w["qp_num"].to_string(),
                                    w["wr_id"].to_string(),
                                    s(&w["opcode"]),
                                    s(&w["status"]),
                                    w["byte_len"].to_string(),
                                    w.get("imm_data")
                                        .filter(|x| !x.is_null())
                                        .map_or("-".into(), |x| x.to_string()),
                                    w.get("src_qp")
                                        .filter(|x| !x.is_null())
                                        .map_or("-".into(), |x| x.to_string()),
                                ]
                            })
                    });
                    table(
                        out,
                        &[
                            "side", "qpn", "wr_id", "opcode", "status", "bytes", "imm", "src_qp",
                        ],
                        rows,
                    )
                    .map_err(io)?;
                    if v["cq"]["in_error"] == true {
                        writeln!(
                            out,
                            "CQ {} overflowed: completions were lost",
                            s(&v["cq"]["cqn"])
                        )
                        .map_err(io)?;
                    }
                    return Ok(0);
                }
                v
            }
        },
        Cmd::Cm { verb } => {
            let (v, table): (Value, tables::Table) = match verb {
                CmVerb::Listen { port, backlog, udp } => (
                    c.call(
                        "POST",
                        "/v1/cm/listeners",
                        Some(object(&[
                            ("port", json!(port)),
                            ("backlog", json!(backlog)),
                            ("space", json!(if *udp { "udp" } else { "tcp" })),
                        ])),
                    )?,
                    tables::cm_listener_table,
                ),
                CmVerb::Unlisten { port, udp } => {
                    let space = if *udp { "udp" } else { "tcp" };
                    c.call(
                        "DELETE",
                        &format!("/v1/cm/listeners/{port}?space={space}"),
                        None,
                    )?;
                    // What is still listened on.
                    (
                        c.call("GET", "/v1/cm/listeners", None)?,
                        tables::cm_listener_table,
                    )
                }
                CmVerb::Listeners => (
                    c.call("GET", "/v1/cm/listeners", None)?,
                    tables::cm_listener_table,
                ),
                CmVerb::Connect {
                    peer,
                    qp,
                    timeout_ms,
                } => {
                    let qpn = rc_qp(&c, *qp)?;
                    let b = json!({"qpn": qpn, "peer": peer.ip().to_string(),
                                       "port": peer.port(), "timeout_ms": timeout_ms});
                    (c.call("POST", "/v1/cm/connect", Some(b))?, tables::cm_table)
                }
                CmVerb::Accept {
                    port,
                    qp,
                    timeout_ms,
                } => {
                    let qpn = rc_qp(&c, *qp)?;
                    let b = json!({"port": port, "qpn": qpn, "timeout_ms": timeout_ms});
                    (c.call("POST", "/v1/cm/accept", Some(b))?, tables::cm_table)
                }
                CmVerb::Show { id } => {
                    (one_or_all(&c, "/v1/cm/connections", *id)?, tables::cm_table)
                }
                CmVerb::Disconnect { id } => (
                    c.call("DELETE", &format!("/v1/cm/connections/{id}"), None)?,
                    tables::cm_table,
                ),
            };
            if as_table(&v, cli.json, out, table)? {
                return Ok(0);
            }
            v
        }
        Cmd::Apps => {
            let v = c.call("GET", "/v1/apps", None)?;
            if !cli.json {
                tables::app_table(out, v.as_array().map_or(&[][..], Vec::as_slice)).map_err(io)?;
                return Ok(0);
            }
            v
        }
        Cmd::Health => {
            let v = c.call("GET", "/v1/health", None)?;
            if v["status"] != "ok" {
                return Err(Fail(1, format!("roced is not healthy: {v}")));
            }
            if !cli.json {
                writeln!(out, "ok: {} lcores", v["lcores"]).map_err(io)?;
                return Ok(0);
            }
            v
        }
        Cmd::Stats => {
            let v = c.call("GET", "/v1/stats", None)?;
            if !cli.json {
                for l in v["lcores"].as_array().into_iter().flatten() {
                    writeln!(out, "lcore {}:", l["lcore"]).map_err(io)?;
                    for (k, x) in l["counters"].as_object().into_iter().flatten() {
                        if x.as_u64() != Some(0) {
                            writeln!(out, "  {k:<32} {x}").map_err(io)?;
                        }
                    }
                }
                return Ok(0);
            }
            v
        }
        Cmd::Cc {
            verb:
                CcVerb::Set {
                    qpn,
                    cc,
                    profile,
                    knobs,
                },
        } => {
            let mut b = json!({});
            if let Some(k) = cc {
                b["cc"] = json!(k);
            }
            if let Some(p) = profile {
                b["cc_profile"] = json!(p);
            }
            if !knobs.is_empty() {
                let m: serde_json::Map<String, Value> =
                    knobs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                b["dcqcn"] = Value::Object(m);
            }
            let q = c.call("PUT", &format!("/v1/qps/{qpn}/cc"), Some(b))?;
            json!({"qpn": qpn, "cc": q["cc"]})
        }
        Cmd::Cc {
            verb: CcVerb::Show { qpn },
        } => {
            let q = c.call("GET", &format!("/v1/qps/{qpn}"), None)?;
            let v = json!({"qpn": qpn, "cc": q["cc"]});
            if !cli.json {
                let cc = &q["cc"];
                let gbps = |x: &Value| x.as_f64().map_or("-".into(), |b| format!("{:.3}", b / 1e9));
                writeln!(
                    out,
                    "qp {qpn}: cc {}  rate {} Gb/s  target {} Gb/s  alpha {}",
                    s(&cc["kind"]),
                    gbps(&cc["rate_bps"]),
                    gbps(&cc["target_bps"]),
                    cc["alpha"]
                        .as_f64()
                        .map_or("-".into(), |a| format!("{a:.4}"))
                )
                .map_err(io)?;
                if let Some(k) = cc["dcqcn"].as_object() {
                    for (name, x) in k {
                        writeln!(out, "  {name:<32} {x}").map_err(io)?;
                    }
                }
                return Ok(0);
            }
            v
        }
    };
    let text = if cli.json {
        v.to_string()
    } else {
        serde_json::to_string_pretty(&v).unwrap_or_default()
    };
    writeln!(out, "{text}").map_err(io)?;
    Ok(0)
}

fn post_body(verb: &PostVerb) -> (u32, &'static str, Value) {
    let sge = |l: &Local| json!([{"addr": l.addr, "length": l.length, "lkey": l.lkey}]);
    let remote = |b: &mut Value, r: &Remote| {
        b["rkey"] = json!(r.rkey);
        b["remote_addr"] = json!(r.remote_addr);
    };
    match verb {
        PostVerb::Write {
            qpn,
            local,
            remote: r,
            imm,
        } => {
            let op = if imm.is_some() { "write-imm" } else { "write" };
            let mut b = json!({"opcode": op, "wr_id": local.wr_id, "sge": sge(local)});
            remote(&mut b, r);
            if let Some(i) = imm {
                b["imm"] = json!(i);
            }
            (*qpn, "send", b)
        }
        PostVerb::Read {
            qpn,
            local,
            remote: r,
        } => {
            let mut b = json!({"opcode": "read", "wr_id": local.wr_id, "sge": sge(local)});
            remote(&mut b, r);
            (*qpn, "send", b)
        }
        PostVerb::Send {
            qpn,
            local,
            imm,
            ud_gid,
            ud_qpn,
            ud_qkey,
        } => {
            let op = if imm.is_some() { "send-imm" } else { "send" };
            let mut b = json!({"opcode": op, "wr_id": local.wr_id, "sge": sge(local)});
            if let Some(i) = imm {
                b["imm"] = json!(i);
            }
            if let (Some(g), Some(q), Some(k)) = (ud_gid, ud_qpn, ud_qkey) {
                b["ud"] = json!({"remote_gid": g, "remote_qpn": q, "remote_qkey": k});
            }
            (*qpn, "send", b)
        }
        PostVerb::Recv { qpn, local } => (
            *qpn,
            "recv",
            json!({"wr_id": local.wr_id, "sge": sge(local)}),
        ),
        PostVerb::FetchAdd {
            qpn,
            local,
            remote: r,
            add,
        } => {
            let mut b = json!({"opcode": "fetch-add", "wr_id": local.wr_id, "sge": sge(local),
                               "add": add});
            remote(&mut b, r);
            (*qpn, "send", b)
        }
        PostVerb::CmpSwap {
            qpn,
            local,
            remote: r,
            compare,
            swap,
        } => {
            let mut b = json!({"opcode": "cmp-swap", "wr_id": local.wr_id, "sge": sge(local),
                               "compare": compare, "swap": swap});
            remote(&mut b, r);
            (*qpn, "send", b)
        }
    }
}

fn decode(
    file: &std::path::Path,
    verify: bool,
    json: bool,
    out: &mut dyn Write,
) -> Result<u8, Fail> {
    let mut w = std::io::BufWriter::new(out);
    let s =
        crate::decode::decode(file, json, &mut w).map_err(|e| Fail(2, format!("decode: {e}")))?;
    let io = |e: std::io::Error| Fail(2, e.to_string());
    if json {
        writeln!(w, "{}", crate::decode::summary_json(&s)).map_err(io)?;
    } else {
        write!(w, "{}", crate::decode::summary_text(&s)).map_err(io)?;
    }
    w.flush().map_err(io)?;
    if verify && s.bad_icrc > 0 {
        return Err(Fail(
            1,
            format!("decode: {} RoCEv2 packet(s) with a bad ICRC", s.bad_icrc),
        ));
    }
    Ok(0)
}

/// `base/id`, or every object at `base` when no id is given.
/// `qp`, or a new RC QP (in RESET) for a CM connection to take.
fn rc_qp(c: &Client, qp: Option<u32>) -> Result<u32, Fail> {
    match qp {
        Some(q) => Ok(q),
        None => {
            let v = c.call("POST", "/v1/qps", Some(json!({})))?;
            v["qpn"]
                .as_u64()
                .map(|q| q as u32)
                .ok_or_else(|| Fail(2, format!("roced created no QP: {v}")))
        }
    }
}

fn one_or_all(c: &Client, base: &str, id: Option<u32>) -> Result<Value, Fail> {
    match id {
        Some(k) => c.call("GET", &format!("{base}/{k}"), None),
        None => c.call("GET", base, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_str(args: &[&str]) -> (u8, String, String) {
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let code = run(
            std::iter::once("rocectl").chain(args.iter().copied()),
            &mut o,
            &mut e,
        );
        (
            code,
            String::from_utf8(o).unwrap(),
            String::from_utf8(e).unwrap(),
        )
    }

    #[test]
    fn sizes_and_numbers_parse_as_people_write_them() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("1T").is_err() && parse_size("").is_err());
        assert_eq!(parse_u64("0x10"), Ok(16));
        assert!(parse_u32("0x1_0000_0000").is_err());
        assert_eq!(unhex("de ad be ef"), Ok(vec![0xde, 0xad, 0xbe, 0xef]));
        assert!(unhex("abc").is_err() && unhex("zz").is_err());
    }

    #[test]
    fn usage_errors_exit_2_and_say_what_is_wrong() {
        let (code, _, err) = run_str(&["mr", "reg", "--size", "lots"]);
        assert_eq!(code, 2);
        assert!(err.contains("\"lots\""), "{err}");
        let (code, _, err) = run_str(&["qp", "connect", "1"]);
        assert_eq!(code, 2);
        assert!(err.contains("--remote-qpn"), "{err}");
        let (code, out, _) = run_str(&["--help"]);
        assert_eq!(code, 0);
        assert!(out.contains("Examples"), "{out}");
    }

    #[test]
    fn an_unreachable_roced_is_said_plainly() {
        for cmd in ["port show", "health"] {
            let mut args = vec!["--api", "127.0.0.1:1"];
            args.extend(cmd.split(' '));
            let (code, _, err) = run_str(&args);
            assert_eq!(code, 2, "{cmd}");
            assert!(
                err.contains("cannot reach roced at http://127.0.0.1:1"),
                "{cmd}: {err}"
            );
        }
    }

    #[test]
    fn completions_are_printed_for_bash() {
        let (code, out, _) = run_str(&["completions", "bash"]);
        assert_eq!(code, 0);
        assert!(out.contains("rocectl") && out.contains("connect"));
    }
}
