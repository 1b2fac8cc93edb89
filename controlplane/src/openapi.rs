//! The OpenAPI 3.0 description of roced's REST API, served at `/v1/openapi.json`.
//!
//! Written out here rather than derived: the handlers parse raw bodies themselves (so that
//! every mistake gets its own code and message), and the limits this document states are the
//! ones they enforce (`tests/rdma_nodes.rs` runs schemathesis against it).

use serde_json::{Value, json};

fn error_responses(codes: &[u16]) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    for c in codes {
        let what = match c {
            400 => {
                "the request is wrong (bad JSON, unknown field, value out of range); nothing changed"
            }
            404 => "no such object",
            408 => {
                "what the call waited for (the peer's answer, a connection request) did not come \
                 in timeout_ms"
            }
            409 => "the object's state does not allow it now (or the node lacks the memory)",
            503 => "an lcore did not answer",
            504 => {
                "the test did not finish in timeout_ms: it was stopped and its QPs moved to ERR \
                 (modify them to RESET to use them again)"
            }
            _ => "error",
        };
        m.insert(
            c.to_string(),
            json!({"description": what,
                   "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
        );
    }
    m
}

fn json_ok(status: u16, what: &str, schema: Value, errors: &[u16]) -> Value {
    let mut r = error_responses(errors);
    r.insert(
        status.to_string(),
        json!({"description": what, "content": {"application/json": {"schema": schema}}}),
    );
    Value::Object(r)
}

fn body(mut schema: Value) -> Value {
    optional_nullable(&mut schema);
    json!({"required": true, "content": {"application/json": {"schema": schema}}})
}

/// The handlers take `null` for any optional field (as absent): say so in the schema.
fn optional_nullable(schema: &mut Value) {
    let required: Vec<String> = schema["required"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for (name, p) in props.iter_mut() {
            if p.is_object() {
                optional_nullable(p);
                if !required.contains(name) && p.get("$ref").is_none() {
                    p["nullable"] = json!(true);
                }
            }
        }
    }
}

fn path_param(name: &str, what: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "description": what,
           "schema": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}})
}

fn query_param(name: &str, what: &str, max: u64) -> Value {
    json!({"name": name, "in": "query", "required": false, "description": what,
           "schema": {"type": "integer", "minimum": 0, "maximum": max}})
}

fn op(summary: &str, params: Vec<Value>, request: Option<Value>, responses: Value) -> Value {
    let mut o = json!({"summary": summary, "responses": responses});
    if !params.is_empty() {
        o["parameters"] = Value::Array(params);
    }
    if let Some(b) = request {
        o["requestBody"] = b;
    }
    o
}

fn r(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn impairments_nullable(mut v: Value) -> Value {
    optional_nullable(&mut v);
    v
}

/// The document.
pub fn document() -> Value {
    let qpn = || path_param("qpn", "the QP number");
    let key = || path_param("key", "the region's key (lkey = rkey)");
    let port = || path_param("port", "the port index");
    let pdn = || path_param("pdn", "the protection domain's number");
    let cqn = || path_param("cqn", "the CQ's number");
    let max_param = || {
        json!({"name": "max", "in": "query", "required": false,
        "description": "at most this many (default 16)",
        "schema": {"type": "integer", "minimum": 1, "maximum": 4096}})
    };
    let wait_param = || {
        query_param(
            "wait_ms",
            "wait up to this long for the first (at most 30000)",
            30000,
        )
    };
    let deleted = |what: &str, codes: &[u16]| {
        let mut m = error_responses(codes);
        m.insert("204".into(), json!({"description": what}));
        Value::Object(m)
    };
    let u64s = json!({"type": "integer", "minimum": 0, "maximum": 18446744073709551615u64});
    let u32s = json!({"type": "integer", "minimum": 0, "maximum": 4294967295u64});
    let access = json!({"type": "array", "items": {"type": "string",
        "enum": ["local-write", "remote-write", "remote-read", "remote-atomic"]}});
    let byte_ref = json!({"type": "object", "additionalProperties": false, "required": ["lkey", "addr"],
        "properties": {"lkey": {"type": "integer", "minimum": 0, "maximum": 4294967295u64},
                       "addr": {"type": "integer", "minimum": 0, "maximum": 18446744073709551615u64}}});
    let sge = json!({"type": "object", "additionalProperties": false,
        "required": ["addr", "length", "lkey"],
        "properties": {"addr": u64s, "length": u32s, "lkey": u32s}});
    let send_props = json!({
        "opcode": {"type": "string", "enum": ["send", "send-imm", "send-inv", "write", "write-imm",
                                               "read", "cmp-swap", "fetch-add"]},
        "wr_id": u64s, "sge": {"type": "array", "items": sge, "maxItems": 4},
        "remote_addr": u64s, "rkey": u32s, "imm": u32s, "compare": u64s, "swap": u64s,
        "add": u64s, "signaled": {"type": "boolean"}, "solicited": {"type": "boolean"},
        "fence": {"type": "boolean"},
        "inline": {"type": "boolean", "description": "IBV_SEND_INLINE: the bytes are copied at post time (SEND and WRITE, up to the QP's max_inline_data)"},
        "ud": {"type": "object", "additionalProperties": false,
            "required": ["remote_gid", "remote_qpn", "remote_qkey"],
            "description": "a UD QP's destination (verbs' address handle, remote QPN and Q_Key); RC QPs take none",
            "properties": {"remote_gid": {"type": "string", "description": "IPv4 or IPv6 address"},
                "remote_qpn": {"type": "integer", "minimum": 0, "maximum": 16777215},
                "remote_qkey": u32s}}});
    // The attributes connect and modify take (modify also names the target state).
    let attr_props = json!({
        "remote_qpn": {"type": "integer", "minimum": 0, "maximum": 16777215},
        "remote_gid": {"type": "string", "description": "IPv4 or IPv6 address"},
        "remote_psn": {"type": "integer", "minimum": 0, "maximum": 16777215,
            "description": "the PSN the peer QP starts sending with (its sq-psn); an RC QP's RTR needs it"},
        "local_psn": {"type": "integer", "minimum": 0, "maximum": 16777215,
            "description": "the PSN this QP starts sending with (default: the random one it was created with)"},
        "mtu": {"type": "integer", "enum": [256, 512, 1024, 2048, 4096]},
        "timeout": {"type": "integer", "minimum": 0, "maximum": 31},
        "retry_cnt": {"type": "integer", "minimum": 0, "maximum": 7},
        "rnr_retry": {"type": "integer", "minimum": 0, "maximum": 7},
        "min_rnr_timer": {"type": "integer", "minimum": 0, "maximum": 31},
        "max_rd_atomic": {"type": "integer", "minimum": 0, "maximum": 128},
        "access": access.clone(), "dscp": {"type": "integer", "minimum": 0, "maximum": 63}});
    let mut modify_props = attr_props.clone();
    modify_props["state"] =
        json!({"type": "string", "enum": ["INIT", "RTR", "RTS", "SQD", "ERR", "RESET"]});
    modify_props["qkey"] = json!({"type": "integer", "minimum": 0, "maximum": 4294967295u64,
        "description": "a UD QP's Q_Key (INIT)"});
    modify_props["port"] = json!({"type": "integer", "minimum": 0, "maximum": 4294967295u64,
        "description": "a UD QP's port (INIT; default 0)"});
    let cq_mod = json!({"type": "integer", "minimum": 1, "maximum": 16384,
        "description": "signal one request in this many, and the last (perftest's --cq-mod; default 1, every one); held to depth, and 1 with duration_ms"});
    let mut stream_props = send_props.clone();
    stream_props["count"] = json!({"type": "integer", "minimum": 1, "maximum": 100000000});
    stream_props["depth"] = json!({"type": "integer", "minimum": 1, "maximum": 16384});
    stream_props["duration_ms"] = json!({"type": "integer", "minimum": 1, "maximum": 600000,
        "description": "stop posting after this long (perftest's -D); count becomes an upper bound"});
    stream_props["timeout_ms"] = json!({"type": "integer", "minimum": 0, "maximum": 600000});
    stream_props["cq_mod"] = cq_mod.clone();
    let wc = json!({"type": "object", "properties": {
        "wr_id": u64s, "status": {"type": "string"}, "opcode": {"type": "string"},
        "byte_len": u32s, "imm_data": {"type": "integer", "nullable": true},
        "invalidated_rkey": {"type": "integer", "nullable": true}, "qp_num": u32s,
        "src_qp": {"type": "integer", "nullable": true, "description": "the sender's QPN, on UD receives (whose buffers start with the 40-byte GRH)"}}});
    let dcqcn_knobs = json!({"type": "object", "description":
        "DCQCN knobs by NVIDIA's names (rpg_time_reset, rpg_byte_reset, rpg_ai_rate, ...) over the profile's values",
        "additionalProperties": {"type": "number"}});
    let qp_create_body = json!({"type": "object", "additionalProperties": false, "properties": {
                        "lcore": {"type": "integer", "minimum": 0, "maximum": 4294967295u64},
                        "pd": u32s, "send_cq": u32s, "recv_cq": u32s,
                        "max_send_wr": u32s, "max_recv_wr": u32s, "max_send_sge": u32s, "max_recv_sge": u32s,
                        "max_inline_data": {"type": "integer", "minimum": 0, "maximum": 512},
                        "cc": {"type": "string", "enum": ["dcqcn", "none"]},
                        "cc_profile": {"type": "string", "enum": ["nvidia", "paper", "hpcc-ns3"]},
                        "dcqcn": dcqcn_knobs.clone(), "copy_tx": {"type": "boolean"},
                        "type": {"type": "string", "enum": ["RC", "UD"]}}});
    let lat_body = json!({"type": "object", "additionalProperties": false, "required": ["test", "wr"],
        "properties": {"test": {"type": "string", "enum": ["request", "write", "send"]},
            "wr": {"type": "object", "additionalProperties": false, "required": ["opcode"], "properties": send_props.clone()},
            "iters": {"type": "integer", "minimum": 1, "maximum": 1000000,
                "description": "iterations; iters or duration_ms is required, not both"},
            "duration_ms": {"type": "integer", "minimum": 1, "maximum": 600000,
                "description": "run this long instead (perftest's -D): a margin of a quarter of the whole seconds at each end, the iterations that complete in the window between are counted"},
            "server": {"type": "boolean"},
            "poll": byte_ref.clone(), "mark": byte_ref,
            "recv": {"type": "array", "items": sge.clone(), "maxItems": 4},
            "rx_depth": u64s,
            "timeout_ms": {"type": "integer", "minimum": 0, "maximum": 600000}}});
    // The receive-stream body (one QP in the path, or several in `qpns`) and its answer.
    let recv_stream_props = json!({"wr_id": u64s, "sge": {"type": "array", "items": sge.clone(), "maxItems": 4},
        "count": {"type": "integer", "minimum": 1, "maximum": 100000000,
            "description": "messages to receive; count or duration_ms is required"},
        "duration_ms": {"type": "integer", "minimum": 1, "maximum": 600000,
            "description": "instead of count: count what arrives within this long of the first arrival, keep reposting 1 s more, then answer (perftest's -D)"},
        "posted": u64s,
        "timeout_ms": {"type": "integer", "minimum": 0, "maximum": 600000}});
    let mut recv_streams_props = recv_stream_props.clone();
    recv_streams_props["qpns"] =
        json!({"type": "array", "minItems": 1, "maxItems": crate::api::MAX_BULK, "items": u32s});
    let recv_stream_done = json_ok(
        200,
        "done: from the first arrival to the last (timed: the window)",
        json!({"type": "object", "properties": {
        "completed": u64s, "errors": u64s, "elapsed_ns": u64s,
        "best_ns_per_wr": {"type": "number", "nullable": true}}}),
        &[400, 404, 409, 503, 504],
    );
    let recv_stream_path = json!({"post": op("The QP's lcore receives `count` messages itself, `posted` receives of this one already posted, reposting as they complete (perftest's SEND bandwidth server)",
        vec![qpn()],
        Some(body(json!({"type": "object", "additionalProperties": false,
            "properties": recv_stream_props}))),
        recv_stream_done.clone())});
    let recv_streams_path = json!({"post": op("Receive streams on several QPs of one lcore at once (a SEND bandwidth server with several QPs): `count` messages and `posted` receives on each; the sum, from the first arrival on any to the last",
        vec![],
        Some(body(json!({"type": "object", "additionalProperties": false, "required": ["qpns"],
            "properties": recv_streams_props}))),
        recv_stream_done)});
    let bulk_path = json!({"post": op("Create `count` RC QPs (in RESET) on one lcore, all or none: a perftest run with several QPs",
        vec![], Some(body(json!({"type": "object", "additionalProperties": false, "required": ["count"],
            "properties": {"count": {"type": "integer", "minimum": 1, "maximum": crate::api::MAX_BULK},
                "lcore": {"type": "integer", "minimum": 0, "maximum": 4294967295u64},
                "max_send_wr": u32s, "max_recv_wr": u32s,
                "max_inline_data": {"type": "integer", "minimum": 0, "maximum": 512},
                "cc": {"type": "string", "enum": ["dcqcn", "none"]}}}))),
        json_ok(201, "the QPs", json!({"type": "object", "properties": {
            "qpns": {"type": "array", "items": u32s}, "lcore": {"type": "integer"}}}), &[400, 409, 503]))});
    let bulk_connect_path = json!({"post": op("Connect several QPs to RTS with shared attributes, all or none (the connected ones go back to RESET on a failure)",
        vec![], Some(body(json!({"type": "object", "additionalProperties": false, "required": ["qps", "attr"],
            "properties": {"qps": {"type": "array", "minItems": 1, "maxItems": crate::api::MAX_BULK, "items": {
                "type": "object", "additionalProperties": false, "required": ["qpn", "remote_qpn", "remote_psn"],
                "properties": {"qpn": u32s, "remote_qpn": {"type": "integer", "minimum": 0, "maximum": 16777215},
                    "remote_psn": {"type": "integer", "minimum": 0, "maximum": 16777215},
                    "local_psn": {"type": "integer", "minimum": 0, "maximum": 16777215}}}},
                "attr": {"type": "object", "additionalProperties": false, "required": ["remote_gid"],
                    "properties": attr_props.clone()}}}))),
        json_ok(200, "connected", json!({"type": "object", "properties": {"connected": {"type": "integer"}}}),
            &[400, 404, 409, 503]))});
    let app = json!({"type": "object",
        "properties": {"id": {"type": "integer"}, "pid": {"type": "integer"},
            "command": {"type": "string"}, "pds": {"type": "array", "items": u32s},
            "mrs": {"type": "array", "items": u32s}, "cqs": {"type": "integer"},
            "qps": {"type": "array", "items": u32s}, "ahs": {"type": "integer"},
            "counters": {"type": "object", "properties": {
                "sends": {"type": "integer"}, "recvs": {"type": "integer"},
                "completions": {"type": "integer"}, "refused": {"type": "integer"},
                "broken_rings": {"type": "integer"}}}}});
    let apps_path = json!({"get": op("Applications attached to the attach socket: pid, command, the PDs, MRs (local keys), CQs, QPs and address handles each made, and what its QPs posted, completed and had refused through their rings", vec![], None,
        json_ok(200, "applications", json!({"type": "array", "items": app}), &[]))});
    let cm_id = || path_param("id", "the connection's communication ID");
    let cm_port = || {
        json!({"name": "port", "in": "path", "required": true,
        "description": "the port listened on",
        "schema": {"type": "integer", "minimum": 0, "maximum": 65535}})
    };
    let cm_space = json!({"type": "string", "enum": ["tcp", "udp"],
        "description": "rdma_cm's port space: tcp (RC connections, the default) or udp (UD services resolved by SIDR)"});
    let cm_space_query = json!({"name": "space", "in": "query", "required": false,
        "description": "the listener's port space (default tcp)", "schema": cm_space.clone()});
    let cm_wait = json!({"type": "integer", "minimum": 0, "maximum": crate::api::MAX_CM_WAIT_MS,
        "description": "wait up to this long for the peer (default 10000)"});
    let cm_listeners_path = json!({
        "get": op("The CM's listeners: port, service ID, backlog and REQs waiting for an accept", vec![], None,
            json_ok(200, "listeners", json!({"type": "array", "items": r("CmListener")}), &[])),
        "post": op("Listen on a port of one of rdma_cm's port spaces (rdma_listen): REQs (udp: SIDR_REQs) for it wait, up to backlog, for an accept; one past it is rejected (no resources; udp: SIDR status no QP)",
            vec![], Some(body(json!({"type": "object", "additionalProperties": false, "required": ["port"],
                "properties": {"port": {"type": "integer", "minimum": 0, "maximum": 65535},
                               "backlog": {"type": "integer", "minimum": 1, "maximum": crate::rdma::MAX_BACKLOG},
                               "space": cm_space.clone()}}))),
            json_ok(201, "the listener", r("CmListener"), &[400, 409, 500, 503]))
    });
    let cm_paths = json!({
        "unlisten": {"delete": op("Stop listening; REQs still waiting are rejected", vec![cm_port(), cm_space_query], None,
            deleted("no longer listening", &[400, 404, 503]))},
        "connect": {"post": op("Connect an RC QP in RESET to whoever listens on peer:port (rdma_resolve_addr, rdma_resolve_route, rdma_connect): the REQ carries rdma_cm's header, the QP goes to RTS with what the REP carries, the RTU is sent",
            vec![], Some(body(json!({"type": "object", "additionalProperties": false, "required": ["qpn", "peer", "port"],
                "properties": {"qpn": u32s, "peer": {"type": "string", "description": "the peer's IPv4 or IPv6 address"},
                               "port": {"type": "integer", "minimum": 0, "maximum": 65535}, "timeout_ms": cm_wait}}))),
            json_ok(201, "the connection, established", r("CmConnection"), &[400, 404, 408, 409, 500, 503]))},
        "accept": {"post": op("Take the oldest REQ waiting on a listened port (waiting for one), move an RC QP in RESET to RTS with what it carries, answer with a REP and wait for the RTU (rdma_get_cm_event, rdma_accept). With space udp: the oldest SIDR_REQ, answered with a UD QP (brought from RESET to RTS with Q_Key 0x01234567) and its Q_Key",
            vec![], Some(body(json!({"type": "object", "additionalProperties": false, "required": ["port", "qpn"],
                "properties": {"port": {"type": "integer", "minimum": 0, "maximum": 65535}, "qpn": u32s,
                               "timeout_ms": cm_wait, "space": cm_space,
                               "id": {"type": "integer", "minimum": 0, "maximum": 4294967295u64,
                                      "description": "accept this waiting request (its connection ID, state requested in /v1/cm/connections) instead of the oldest"}}}))),
            json_ok(201, "the connection, established (udp: resolved)", r("CmConnection"), &[400, 404, 408, 409, 500, 503]))},
        "resolve": {"post": op("Ask whoever listens on peer:port of rdma_cm's UDP port space which UD QP serves it (SIDR, as rdma_connect on a UD rdma_cm ID): a SIDR_REQ with rdma_cm's header; the answer's remote_qpn and remote_qkey are where to send. A UD QP in RESET goes to RTS with Q_Key 0x01234567",
            vec![], Some(body(json!({"type": "object", "additionalProperties": false, "required": ["qpn", "peer", "port"],
                "properties": {"qpn": u32s, "peer": {"type": "string", "description": "the peer's IPv4 or IPv6 address"},
                               "port": {"type": "integer", "minimum": 0, "maximum": 65535}, "timeout_ms": cm_wait}}))),
            json_ok(201, "the request, resolved", r("CmConnection"), &[400, 404, 408, 409, 500, 503]))},
        "connections": {"get": op("The CM connections the node remembers, with their state", vec![], None,
            json_ok(200, "connections", json!({"type": "array", "items": r("CmConnection")}), &[]))},
        "connection": {
            "get": op("One CM connection", vec![cm_id()], None,
                json_ok(200, "the connection", r("CmConnection"), &[400, 404])),
            "delete": op("Disconnect (rdma_disconnect): a DREQ to the peer, and the QP to ERR", vec![cm_id()], None,
                json_ok(200, "the connection after the DREQ: disconnecting until the DREP", r("CmConnection"), &[400, 404, 409, 503]))
        }
    });
    let streams_path = json!({"post": op("Stream on several QPs of one lcore at once: each posts `count` copies of wr (with its own remote_addr and rkey when given), `depth` outstanding",
        vec![], Some(body(json!({"type": "object", "additionalProperties": false, "required": ["qps", "wr"],
            "properties": {"qps": {"type": "array", "minItems": 1, "maxItems": crate::api::MAX_BULK, "items": {
                "type": "object", "additionalProperties": false, "required": ["qpn"],
                "properties": {"qpn": u32s, "remote_addr": u64s, "rkey": u32s}}},
                "wr": {"type": "object", "additionalProperties": false, "required": ["opcode"], "properties": send_props.clone()},
                "count": {"type": "integer", "minimum": 1, "maximum": 100000000},
                "depth": {"type": "integer", "minimum": 1, "maximum": 16384},
                "cq_mod": cq_mod,
                "timeout_ms": {"type": "integer", "minimum": 0, "maximum": 600000},
                "duration_ms": {"type": "integer", "minimum": 1, "maximum": 600000,
                    "description": "stop posting after this long (perftest's -D); count (or duration_ms) is required"}}}))),
        json_ok(200, "done: the sum over the QPs, from the start to the last completion", json!({"type": "object", "properties": {
            "completed": u64s, "errors": u64s, "elapsed_ns": u64s,
            "best_ns_per_wr": {"type": "number", "nullable": true}}}), &[400, 404, 409, 503, 504]))});
    let latency_path = json!({"post": op("One of perftest's latency tests on the QP's lcore: request (READ/atomic, one at a time), write (WRITE ping-pong: poll is the byte the peer's WRITE sets, mark the last byte of ours) or send (SEND ping-pong over rx_depth receives already posted, reposted from recv)",
        vec![qpn()], Some(body(lat_body)),
        json_ok(200, "when each iteration was posted (ns from the first; empty for a timed test), or a timed test's sample", json!({"type": "object", "properties": {
            "posted_ns": {"type": "array", "items": u64s}, "errors": u64s,
            "failure": {"type": "string", "nullable": true}, "elapsed_ns": u64s,
            "sample": {"type": "object", "nullable": true, "properties": {"iters": u64s, "window_ns": u64s}}}}), &[400, 404, 409, 503, 504]))});
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "roced",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "ferroce's node API: ports, memory regions, RC queue pairs, work requests, completions, impairments, counters. Errors are JSON {code, message}; a request is applied whole or not at all."
        },
        "paths": {
            "/v1/health": {"get": op("Liveness and lcore count", vec![], None,
                json_ok(200, "up", json!({"type": "object", "required": ["status"],
                    "properties": {"status": {"type": "string"}, "lcores": {"type": "integer"}}}), &[]))},
            "/v1/openapi.json": {"get": op("This document", vec![], None,
                json_ok(200, "the OpenAPI document", json!({"type": "object"}), &[]))},
            "/v1/ports": {"get": op("Ports: device, driver, MAC, MTU, link, counters", vec![], None,
                json_ok(200, "every port", json!({"type": "array", "items": r("Port")}), &[]))},
            "/v1/ports/{port}": {"get": op("One port", vec![port()], None,
                json_ok(200, "the port", r("Port"), &[400, 404]))},
            "/v1/pds": {
                "get": op("Every protection domain (PD 0 is the default: regions and QPs created without a pd are in it)",
                    vec![], None, json_ok(200, "PDs", json!({"type": "array", "items": r("Pd")}), &[])),
                "post": op("Allocate a protection domain (no attributes)", vec![],
                    Some(json!({"required": false, "content": {"application/json": {"schema":
                        {"type": "object", "additionalProperties": false, "properties": {}}}}})),
                    json_ok(201, "the PD", r("Pd"), &[400, 409, 503]))
            },
            "/v1/pds/{pdn}": {
                "get": op("One protection domain", vec![pdn()], None, json_ok(200, "the PD", r("Pd"), &[400, 404])),
                "delete": op("Free a protection domain (refused while regions or QPs are in it, and for PD 0)",
                    vec![pdn()], None, deleted("freed", &[400, 404, 409, 503]))
            },
            "/v1/cqs": {
                "get": op("Every created completion queue", vec![], None,
                    json_ok(200, "CQs", json!({"type": "array", "items": r("Cq")}), &[503])),
                "post": op("Create a completion queue on an lcore; QPs that use it are placed on that lcore", vec![],
                    Some(body(json!({"type": "object", "additionalProperties": false, "required": ["cqe"],
                        "properties": {"cqe": {"type": "integer", "minimum": 1, "maximum": 65536},
                                       "lcore": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}}}))),
                    json_ok(201, "the CQ", r("Cq"), &[400, 409, 503]))
            },
            "/v1/cqs/{cqn}": {
                "get": op("One CQ: capacity, completions waiting, users, overflow", vec![cqn()], None,
                    json_ok(200, "the CQ", r("Cq"), &[400, 404, 503])),
                "delete": op("Destroy a CQ (refused while a QP uses it)", vec![cqn()], None,
                    deleted("destroyed", &[400, 404, 409, 503]))
            },
            "/v1/cqs/{cqn}/completions": {"get": op("Poll a CQ", vec![cqn(), max_param(), wait_param()], None,
                json_ok(200, "completions, oldest first, and the CQ after", json!({"type": "object",
                    "required": ["completions", "cq"], "properties": {
                    "completions": {"type": "array", "items": wc.clone()}, "cq": r("Cq")}}),
                    &[400, 404, 503]))},
            "/v1/ports/{port}/impair": {
                "get": op("A port's impairment settings and counters, per direction", vec![port()], None,
                    json_ok(200, "settings and counters", json!({"type": "object"}), &[400, 404])),
                "put": op("Set one direction's impairments (replaces that direction's settings)", vec![port()],
                    Some(body(r("Impairments"))),
                    json_ok(200, "the settings now in force", json!({"type": "object"}), &[400, 404, 503]))
            },
            "/v1/mrs": {
                "get": op("Every memory region", vec![], None,
                    json_ok(200, "regions", json!({"type": "array", "items": r("Mr")}), &[])),
                "post": op("Register a region of zeroed hugepage memory", vec![],
                    Some(body(json!({"type": "object", "additionalProperties": false, "required": ["length"],
                        "properties": {"length": {"type": "integer", "minimum": 1, "maximum": 1073741824},
                                       "access": access, "addr": u64s, "pd": u32s}}))),
                    json_ok(201, "the region", r("Mr"), &[400, 409, 503]))
            },
            "/v1/mrs/{key}": {
                "get": op("One region", vec![key()], None, json_ok(200, "the region", r("Mr"), &[400, 404])),
                "delete": op("Deregister a region", vec![key()], None,
                    deleted("deregistered", &[400, 404, 503]))
            },
            "/v1/mrs/{key}/data": {
                "get": op("Bytes of a region", vec![key(),
                        query_param("addr", "start address (default: the region's)", u64::MAX),
                        query_param("length", "bytes (default: the whole region)", 1 << 30)], None, {
                    let mut m = error_responses(&[400, 404]);
                    m.insert("200".into(), json!({"description": "the bytes",
                        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}));
                    Value::Object(m)
                }),
                "put": op("Write bytes into a region", vec![key(),
                        query_param("addr", "start address (default: the region's)", u64::MAX),
                        query_param("length", "must equal the body's size when given", 1 << 30)],
                    Some(json!({"required": true, "content": {"application/octet-stream":
                        {"schema": {"type": "string", "format": "binary"}}}})),
                    json_ok(200, "written", json!({"type": "object", "properties":
                        {"written": {"type": "integer"}, "addr": u64s}}), &[400, 404]))
            },
            "/v1/qps": {
                "get": op("Every QP", vec![], None,
                    json_ok(200, "QPs", json!({"type": "array", "items": r("Qp")}), &[503])),
                "post": op("Create an RC or UD QP (in RESET)", vec![],
                    Some(body(qp_create_body)),
                    json_ok(201, "the QP", json!({"type": "object", "required": ["qpn", "lcore", "state", "sq-psn"],
                        "properties": {"qpn": u32s, "lcore": {"type": "integer"}, "type": {"type": "string"},
                                       "state": {"type": "string"},
                                       "sq-psn": {"type": "integer", "minimum": 0, "maximum": 16777215,
                                           "description": "the random PSN it starts sending with"}}}), &[400, 409, 503]))
            },
            "/v1/qps/{qpn}": {
                "get": op("A QP: `rdma resource show qp` fields, caps, congestion control, counters", vec![qpn()], None,
                    json_ok(200, "the QP", r("Qp"), &[400, 404, 503])),
                "delete": op("Destroy a QP", vec![qpn()], None, deleted("destroyed", &[400, 404, 503]))
            },
            "/v1/qps/{qpn}/modify": {"post": op("One verbs transition (INIT, RTR, RTS, SQD, ERR, RESET) with the attributes it takes; an RC QP's RTR needs remote_qpn, remote_gid and remote_psn, a UD QP's INIT its qkey", vec![qpn()],
                Some(body(json!({"type": "object", "additionalProperties": false,
                    "required": ["state"], "properties": modify_props}))),
                json_ok(200, "the QP in its new state", r("Qp"), &[400, 404, 409, 503]))},
            "/v1/qps/{qpn}/connect": {"post": op("RESET -> INIT -> RTR -> RTS towards the peer", vec![qpn()],
                Some(body(json!({"type": "object", "additionalProperties": false,
                    "required": ["remote_qpn", "remote_gid", "remote_psn"], "properties": attr_props}))),
                json_ok(200, "the QP, in RTS", r("Qp"), &[400, 404, 409, 503]))},
            "/v1/qps/{qpn}/send": {"post": op("Post a send work request", vec![qpn()],
                Some(body(json!({"type": "object", "additionalProperties": false, "required": ["opcode"],
                    "properties": send_props}))),
                json_ok(200, "posted", json!({"type": "object", "properties":
                    {"posted": {"type": "boolean"}, "wr_id": u64s}}), &[400, 404, 409, 503]))},
            "/v1/qps/{qpn}/recv": {"post": op("Post a receive work request", vec![qpn()],
                Some(body(json!({"type": "object", "additionalProperties": false, "properties":
                    {"wr_id": u64s, "sge": {"type": "array", "items": sge, "maxItems": 4}}}))),
                json_ok(200, "posted", json!({"type": "object", "properties":
                    {"posted": {"type": "boolean"}, "wr_id": u64s}}), &[400, 404, 409, 503]))},
            "/v1/qps/{qpn}/completions": {"get": op("Poll a QP's own send and receive CQs (409 when its completions go to a created CQ)",
                    vec![qpn(), max_param(), wait_param()], None,
                json_ok(200, "completions", json!({"type": "object", "properties": {
                    "send": {"type": "array", "items": wc}, "recv": {"type": "array", "items": wc}}}),
                    &[400, 404, 409, 503]))},
            "/v1/qps/{qpn}/stream": {"post": op("The QP's lcore posts `count` copies of a send work request itself, `depth` outstanding",
                vec![qpn()],
                Some(body(json!({"type": "object", "additionalProperties": false, "required": ["opcode"],
                    "properties": stream_props}))),
                json_ok(200, "done", json!({"type": "object", "properties": {"completed": u64s,
                    "errors": u64s, "elapsed_ns": u64s,
                    "best_ns_per_wr": {"type": "number", "nullable": true,
                        "description": "fewest ns per work request from the first post to any completion (perftest's peak)"}}}),
                    &[400, 404, 409, 503, 504]))},
            "/v1/qps/{qpn}/latency": latency_path,
            "/v1/qps/bulk": bulk_path,
            "/v1/qps/bulk/connect": bulk_connect_path,
            "/v1/qps/bulk/destroy": {"post": op("Destroy several QPs, none if one of them does not exist", vec![],
                Some(body(json!({"type": "object", "additionalProperties": false, "required": ["qpns"],
                    "properties": {"qpns": {"type": "array", "minItems": 1, "maxItems": crate::api::MAX_BULK, "items": u32s}}}))),
                json_ok(200, "destroyed", json!({"type": "object", "properties": {"destroyed": {"type": "integer"}}}),
                    &[400, 404, 503]))},
            "/v1/streams": streams_path,
            "/v1/qps/{qpn}/recv-stream": recv_stream_path,
            "/v1/recv-streams": recv_streams_path,
            "/v1/apps": apps_path,
            "/v1/cm/listeners": cm_listeners_path,
            "/v1/cm/listeners/{port}": cm_paths["unlisten"],
            "/v1/cm/connect": cm_paths["connect"],
            "/v1/cm/accept": cm_paths["accept"],
            "/v1/cm/resolve": cm_paths["resolve"],
            "/v1/cm/connections": cm_paths["connections"],
            "/v1/cm/connections/{id}": cm_paths["connection"],
            "/v1/stats": {"get": op("Per-lcore counters (rxe/mlx5 names) and poll-loop counters", vec![], None,
                json_ok(200, "counters", json!({"type": "object", "properties": {"lcores": {"type": "array",
                    "items": {"type": "object"}}}}), &[503]))},
            "/metrics": {"get": op("Prometheus exposition", vec![], None, {
                let mut m = error_responses(&[503]);
                m.insert("200".into(), json!({"description": "text format 0.0.4",
                    "content": {"text/plain": {"schema": {"type": "string"}}}}));
                Value::Object(m)
            })}
        },
        "security": [{}, {"bearer": []}],
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
            "description": "required by every endpoint but /v1/health when the node sets [api] token"}},
          "schemas": {
            "Error": {"type": "object", "required": ["code", "message"], "properties": {
                "code": {"type": "string"}, "message": {"type": "string"}}},
            "Port": {"type": "object", "properties": {
                "port": {"type": "integer"}, "device": {"type": "string"}, "driver": {"type": "string"},
                "mac": {"type": "string"}, "mtu": {"type": "integer"}, "link_up": {"type": "boolean"},
                "speed_mbps": {"type": "integer"}, "ipackets": u64s, "opackets": u64s, "ibytes": u64s,
                "obytes": u64s, "imissed": u64s, "ierrors": u64s, "oerrors": u64s, "rx_nombuf": u64s,
                "gids": {"type": "array", "description": "the GID table: link-local, IPv4-mapped, IPv6",
                         "items": {"type": "string"}},
                "xstats": {"type": "object"}}},
            "Mr": {"type": "object", "required": ["lkey", "rkey", "addr", "length"], "properties": {
                "lkey": u32s, "rkey": u32s, "addr": u64s, "length": {"type": "integer"},
                "access": {"type": "array", "items": {"type": "string"}}, "hugepage": {"type": "boolean"}, "zero_copy": {"type": "boolean"},
                "pdn": u32s}},
            "CmListener": {"type": "object", "required": ["port", "space", "service_id", "backlog", "waiting"], "properties": {
                "port": {"type": "integer"}, "space": {"type": "string", "enum": ["tcp", "udp"]}, "service_id": {"type": "string"},
                "backlog": {"type": "integer"}, "waiting": {"type": "integer"}}},
            "CmConnection": {"type": "object", "required": ["id", "role", "space", "state", "port", "peer", "age_ms"], "properties": {
                "id": u32s, "role": {"type": "string", "enum": ["active", "passive"]},
                "space": {"type": "string", "enum": ["tcp", "udp"]},
                "state": {"type": "string", "enum": ["requested", "accepting", "connecting", "replied",
                    "rep_sent", "established", "disconnecting", "rejected", "unreachable", "disconnected", "gone",
                    "resolving", "resolved", "refused"]},
                "port": {"type": "integer"}, "peer": {"type": "string"},
                "peer_port": {"type": "integer", "nullable": true}, "qpn": {"type": "integer", "nullable": true},
                "remote_qpn": {"type": "integer", "nullable": true},
                "remote_qkey": {"type": "integer", "nullable": true},
                "reject_reason": {"type": "string", "nullable": true}, "age_ms": {"type": "integer"}}},
            "Pd": {"type": "object", "required": ["pdn", "mrs", "qps"], "properties": {
                "pdn": u32s, "mrs": {"type": "integer"}, "qps": {"type": "integer"}}},
            "Cq": {"type": "object", "required": ["cqn", "lcore", "cqe", "waiting", "users", "in_error"],
                "properties": {"cqn": u32s, "lcore": {"type": "integer"}, "cqe": {"type": "integer"},
                "waiting": {"type": "integer"}, "users": {"type": "integer"}, "in_error": {"type": "boolean"}}},
            "Qp": {"type": "object", "properties": {
                "lqpn": u32s, "rqpn": u32s, "type": {"type": "string"}, "state": {"type": "string",
                    "enum": ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"]},
                "rq-psn": u32s, "sq-psn": u32s, "pdn": {"type": "integer"}, "lcore": {"type": "integer"},
                "send-cq": {"type": "integer", "nullable": true}, "recv-cq": {"type": "integer", "nullable": true},
                "port": {"type": "integer"}, "path-mtu": {"type": "integer", "nullable": true},
                "remote-gid": {"type": "string", "nullable": true}, "local-gid": {"type": "string", "nullable": true},
                "udp-sport": {"type": "integer", "nullable": true}, "caps": {"type": "object"},
                "qkey": {"type": "integer", "nullable": true},
                "cc": {"type": "object"}, "counters": {"type": "object"}}},
            "Impairments": impairments_nullable(json!({"type": "object", "additionalProperties": false, "required": ["direction"], "properties": {
                "direction": {"type": "string", "enum": ["rx", "tx"]},
                "loss": {"type": "number", "minimum": 0, "maximum": 1},
                "burst": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1},
                          "minItems": 2, "maxItems": 2,
                          "description": "Gilbert-Elliott: [p(good->bad), p(bad->good)]"},
                "corrupt": {"type": "number", "minimum": 0, "maximum": 1},
                "duplicate": {"type": "number", "minimum": 0, "maximum": 1},
                "reorder": {"type": "number", "minimum": 0, "maximum": 1},
                "reorder_delay_us": {"type": "number", "minimum": 0, "maximum": 1000000},
                "congestion": {"type": "object", "additionalProperties": false,
                    "required": ["rate_gbps", "buffer_kb"], "properties": {
                    "rate_gbps": {"type": "number", "exclusiveMinimum": true, "minimum": 0, "maximum": 1000},
                    "buffer_kb": {"type": "integer", "minimum": 0, "maximum": 1048576},
                    "kmin_kb": {"type": "integer", "minimum": 0, "maximum": 1048576},
                    "kmax_kb": {"type": "integer", "minimum": 0, "maximum": 1048576},
                    "pmax": {"type": "number", "minimum": 0, "maximum": 1}}}}}))
        }}
    })
}
