//! Two CMs joined by a lossy wire on simulated time (quinn's `Pair`): every path of the state
//! machine, each timeout at the time IBTA's encoding gives, each retry, each duplicate and each
//! REJ.

use super::*;
use wire::cm::{PortSpace, service_id};

const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sid() -> u64 {
    service_id(PortSpace::Tcp, 7471)
}

fn cfg(seed: u64) -> Config {
    Config {
        local_ca_guid: 0x0200_00ff_fe00_0000 | seed,
        seed,
        max_cm_retries: 3,
        ..Config::default()
    }
}

/// What the wire does to the next message of one attribute in one direction.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fate {
    Drop,
    Duplicate,
}

/// Two CMs, A (10.0.0.1) and B (10.0.0.2), and a wire that delivers at once unless told.
struct Pair {
    a: Cm,
    b: Cm,
    now: Instant,
    /// (from A?, message name, fate, how many times): consumed as messages match.
    rules: Vec<(bool, &'static str, Fate, usize)>,
    /// Every message sent: (from A?, name, time).
    log: Vec<(bool, &'static str, Instant)>,
    ev_a: Vec<Event>,
    ev_b: Vec<Event>,
}

impl Pair {
    fn new() -> Pair {
        let mut b = Cm::new(cfg(2));
        b.listen(sid()).unwrap();
        Pair {
            a: Cm::new(cfg(1)),
            b,
            now: Instant(1_000_000_000),
            rules: Vec::new(),
            log: Vec::new(),
            ev_a: Vec::new(),
            ev_b: Vec::new(),
        }
    }

    fn rule(&mut self, from_a: bool, name: &'static str, fate: Fate, times: usize) {
        self.rules.push((from_a, name, fate, times));
    }

    /// Moves every queued MAD across until both sides are quiet.
    fn drive(&mut self) {
        loop {
            let mut moved = false;
            for from_a in [true, false] {
                loop {
                    let t = if from_a {
                        self.a.poll_transmit()
                    } else {
                        self.b.poll_transmit()
                    };
                    let Some(t) = t else { break };
                    moved = true;
                    let (_, m) = Message::parse(&t.mad).expect("the engine sends CM MADs");
                    assert_eq!(t.to, ip(if from_a { B } else { A }));
                    self.log.push((from_a, m.name(), self.now));
                    let mut copies = 1;
                    if let Some(r) = self
                        .rules
                        .iter_mut()
                        .find(|r| r.0 == from_a && r.1 == m.name() && r.3 > 0)
                    {
                        r.3 -= 1;
                        copies = if r.2 == Fate::Drop { 0 } else { 2 };
                    }
                    for _ in 0..copies {
                        if from_a {
                            self.b.handle_mad(self.now, ip(A), &t.mad);
                        } else {
                            self.a.handle_mad(self.now, ip(B), &t.mad);
                        }
                    }
                }
            }
            while let Some(e) = self.a.poll_event() {
                self.ev_a.push(e);
            }
            while let Some(e) = self.b.poll_event() {
                self.ev_b.push(e);
            }
            if !moved {
                return;
            }
        }
    }

    /// Drives, firing timers, until `until` (or until no timer is left before it).
    fn run_until(&mut self, until: Instant) {
        loop {
            self.drive();
            let next = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= until => {
                    self.now = self.now.max(t);
                    self.a.handle_timeout(self.now);
                    self.b.handle_timeout(self.now);
                }
                _ => {
                    self.now = self.now.max(until);
                    return;
                }
            }
        }
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        self.run_until(until);
    }

    fn connect(&mut self) -> ConnId {
        let c = self.a.connect(self.now, &connect_params()).unwrap();
        self.drive();
        c
    }

    /// B's connection from its last Request event.
    fn b_request(&self) -> (ConnId, Req) {
        self.ev_b
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::Request { conn, req, .. } => Some((*conn, *req)),
                _ => None,
            })
            .expect("B was asked")
    }

    fn sent(&self, from_a: bool, name: &str) -> usize {
        self.log
            .iter()
            .filter(|l| l.0 == from_a && l.1 == name)
            .count()
    }

    /// The times `name` was sent from one side.
    fn times(&self, from_a: bool, name: &str) -> Vec<Instant> {
        self.log
            .iter()
            .filter(|l| l.0 == from_a && l.1 == name)
            .map(|l| l.2)
            .collect()
    }

    /// A full handshake: (A's connection, B's).
    fn establish(&mut self) -> (ConnId, ConnId) {
        let ca = self.connect();
        let (cb, _) = self.b_request();
        self.b.accept(self.now, cb, &accept_params()).unwrap();
        self.drive();
        self.a.establish(ca).unwrap();
        self.drive();
        (ca, cb)
    }
}

fn connect_params() -> ConnectParams {
    let mut private_data = [0u8; cm::private_len::REQ];
    cm::CmaHeader {
        src_port: 40000,
        src: ip(A),
        dst: ip(B),
    }
    .emit(&mut private_data)
    .unwrap();
    let path = Path {
        local_lid: 0xffff,
        remote_lid: 0xffff,
        local_gid: gid_of(ip(A)),
        remote_gid: gid_of(ip(B)),
        hop_limit: 64,
        local_ack_timeout: 19,
        ..Path::default()
    };
    ConnectParams {
        private_data,
        ..ConnectParams::new(sid(), ip(B), path, 0x11, 0xa7_c3df)
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams::new(0x22, 0xae_5466)
}

/// The wait before a resend with the default codes: 4.096 us * 2^20 plus two packet lifetimes.
fn req_wait() -> Duration {
    timeout_of(20) + 2 * Config::default().packet_life
}

#[test]
fn handshake_carries_the_qp_attributes_and_disconnect_waits_out_timewait() {
    let mut p = Pair::new();
    let (ca, cb) = p.establish();
    let (_, req) = p.b_request();
    assert_eq!(
        (req.local_qpn, req.starting_psn, req.path_mtu),
        (0x11, 0xa7_c3df, 3)
    );
    assert_eq!(req.primary.remote_gid, gid_of(ip(B)));
    let cma = cm::CmaHeader::parse(&req.private_data).unwrap();
    assert_eq!((cma.src, cma.src_port), (ip(A), 40000));
    let rep = p
        .ev_a
        .iter()
        .find_map(|e| match e {
            Event::Reply { rep, .. } => Some(*rep),
            _ => None,
        })
        .unwrap();
    assert_eq!((rep.local_qpn, rep.starting_psn), (0x22, 0xae_5466));
    assert_eq!(rep.remote_comm_id, ca.0);
    assert_eq!(p.a.state(ca), Some(State::Established));
    assert_eq!(p.b.state(cb), Some(State::Established));
    assert!(p.ev_b.contains(&Event::Established { conn: cb }));
    assert_eq!(p.a.conns().next().unwrap().3, cb.0, "A knows B's ID");
    p.a.disconnect(p.now, ca).unwrap();
    p.drive();
    assert_eq!(p.sent(true, "DREQ"), 1);
    assert_eq!(p.sent(false, "DREP"), 1);
    assert!(p.ev_a.contains(&Event::Disconnected { conn: ca }));
    assert!(p.ev_b.contains(&Event::Disconnected { conn: cb }));
    assert_eq!(p.a.state(ca), Some(State::Timewait));
    // TIMEWAIT lasts its configured second, then the slots are free.
    p.run_for(Duration::from_millis(999));
    assert_eq!(p.a.state(ca), Some(State::Timewait));
    p.run_for(Duration::from_millis(2));
    assert_eq!((p.a.state(ca), p.b.state(cb)), (None, None));
    assert!(p.ev_a.contains(&Event::TimewaitExit { conn: ca }));
    assert!(p.ev_b.contains(&Event::TimewaitExit { conn: cb }));
    assert_eq!(p.a.counters().established + p.b.counters().established, 2);
    assert_eq!(p.a.counters().retransmits + p.b.counters().retransmits, 0);
}

#[test]
fn a_lost_req_is_sent_again_after_the_response_timeout() {
    let mut p = Pair::new();
    p.rule(true, "REQ", Fate::Drop, 1);
    let t0 = p.now;
    p.connect();
    assert!(p.ev_b.is_empty());
    p.run_for(req_wait() - Duration::from_nanos(1));
    assert_eq!(p.sent(true, "REQ"), 1, "not before the wait");
    p.run_for(Duration::from_nanos(1));
    assert_eq!(p.times(true, "REQ"), [t0, t0 + req_wait()]);
    let (cb, _) = p.b_request();
    assert_eq!(p.b.state(cb), Some(State::ReqRcvd));
    assert_eq!(p.a.counters().retransmits, 1);
}

#[test]
fn an_unanswered_req_is_given_up_after_every_retry_with_a_rej_timeout() {
    let mut p = Pair::new();
    p.rule(true, "REQ", Fate::Drop, 100);
    let t0 = p.now;
    let ca = p.connect();
    p.run_for(Duration::from_secs(60));
    // max_cm_retries 3: four REQs, a wait after each.
    let expect: Vec<Instant> = (0..4).map(|i| t0 + req_wait() * i).collect();
    assert_eq!(p.times(true, "REQ"), expect);
    assert_eq!(p.times(true, "REJ"), [t0 + req_wait() * 4]);
    assert_eq!(p.ev_a, [Event::Unreachable { conn: ca }]);
    assert_eq!(p.a.state(ca), None);
    assert_eq!(p.a.counters().timeouts, 1);
}

#[test]
fn a_req_again_while_the_listener_thinks_gets_an_mra_and_the_active_side_waits_longer() {
    let mut p = Pair::new();
    let t0 = p.now;
    let ca = p.connect();
    // B's consumer does not answer: A resends its REQ after the wait, B answers with an MRA.
    p.run_for(req_wait());
    assert_eq!(p.sent(true, "REQ"), 2);
    assert_eq!(p.times(false, "MRA"), [t0 + req_wait()]);
    assert_eq!(p.a.state(ca), Some(State::MraReqRcvd));
    let requests = p
        .ev_b
        .iter()
        .filter(|e| matches!(e, Event::Request { .. }))
        .count();
    assert_eq!(requests, 1, "the duplicate REQ is not a second connection");
    assert_eq!(p.b.counters().rx_duplicate, 1);
    // The MRA's service timeout (24: 68.7 s) holds A's next REQ back.
    p.run_for(Duration::from_secs(60));
    assert_eq!(p.sent(true, "REQ"), 2);
    let (cb, _) = p.b_request();
    assert_eq!(p.b.state(cb), Some(State::MraReqSent));
    p.b.accept(p.now, cb, &accept_params()).unwrap();
    p.drive();
    p.a.establish(ca).unwrap();
    p.drive();
    assert_eq!(p.b.state(cb), Some(State::Established));
}

#[test]
fn lost_reps_and_rtus_are_recovered_by_the_duplicates_they_cause() {
    // The REP is lost: A's REQ again is answered with the REP again, not a new connection.
    let mut p = Pair::new();
    p.rule(false, "REP", Fate::Drop, 1);
    let t0 = p.now;
    let ca = p.connect();
    let (cb, _) = p.b_request();
    // B accepts 1 ms later, so that its own REP timer is not due when A's REQ timer is.
    p.run_for(Duration::from_millis(1));
    p.b.accept(p.now, cb, &accept_params()).unwrap();
    p.run_until(t0 + req_wait());
    assert_eq!((p.sent(true, "REQ"), p.sent(false, "REP")), (2, 2));
    assert_eq!(p.a.state(ca), Some(State::RepRcvd));
    p.a.establish(ca).unwrap();
    p.drive();
    assert_eq!(p.b.state(cb), Some(State::Established));
    // The RTU is lost: B's REP again (after A's response timeout) is answered with the RTU again.
    let mut p = Pair::new();
    p.rule(true, "RTU", Fate::Drop, 1);
    let (ca, cb) = p.establish();
    assert_eq!(p.b.state(cb), Some(State::RepSent));
    p.run_for(req_wait());
    assert_eq!((p.sent(false, "REP"), p.sent(true, "RTU")), (2, 2));
    assert_eq!(p.b.state(cb), Some(State::Established));
    assert_eq!(p.a.state(ca), Some(State::Established));
    assert_eq!(p.a.counters().rx_duplicate, 1);
    // Every RTU is lost: B gives up after its retries (the REQ's max CM retries) with a REJ.
    let mut p = Pair::new();
    p.rule(true, "RTU", Fate::Drop, 100);
    let (_, cb) = p.establish();
    p.run_for(Duration::from_secs(60));
    assert_eq!(p.sent(false, "REP"), 4);
    assert_eq!(p.sent(false, "REJ"), 1);
    assert!(p.ev_b.contains(&Event::Unreachable { conn: cb }));
    assert_eq!(
        p.a.counters().rx_unexpected,
        1,
        "A, established, drops the REJ"
    );
}

#[test]
fn duplicates_delivered_twice_are_taken_once() {
    let mut p = Pair::new();
    for name in ["REQ", "RTU", "DREQ"] {
        p.rule(true, name, Fate::Duplicate, 1);
    }
    p.rule(false, "REP", Fate::Duplicate, 1);
    p.rule(false, "DREP", Fate::Duplicate, 1);
    let (ca, cb) = p.establish();
    assert_eq!(
        p.ev_b
            .iter()
            .filter(|e| matches!(e, Event::Request { .. }))
            .count(),
        1
    );
    assert_eq!(
        p.ev_a
            .iter()
            .filter(|e| matches!(e, Event::Reply { .. }))
            .count(),
        1
    );
    assert_eq!(
        p.ev_b
            .iter()
            .filter(|e| matches!(e, Event::Established { .. }))
            .count(),
        1
    );
    p.a.disconnect(p.now, ca).unwrap();
    p.drive();
    assert_eq!(
        p.ev_b
            .iter()
            .filter(|e| matches!(e, Event::Disconnected { .. }))
            .count(),
        1
    );
    // The second DREQ found B in TIMEWAIT and got its DREP again.
    assert_eq!(p.sent(false, "DREP"), 2);
    assert_eq!(
        (p.a.state(ca), p.b.state(cb)),
        (Some(State::Timewait), Some(State::Timewait))
    );
}

#[test]
fn a_lost_dreq_or_drep_is_recovered_and_an_unanswered_dreq_given_up() {
    let mut p = Pair::new();
    p.rule(false, "DREP", Fate::Drop, 1);
    let (ca, cb) = p.establish();
    p.a.disconnect(p.now, ca).unwrap();
    p.drive();
    assert_eq!(p.b.state(cb), Some(State::Timewait));
    p.run_for(req_wait());
    assert_eq!((p.sent(true, "DREQ"), p.sent(false, "DREP")), (2, 2));
    assert_eq!(p.a.state(ca), Some(State::Timewait));
    // B is gone altogether: A's DREQs are never answered; A gives up into TIMEWAIT.
    let mut p = Pair::new();
    p.rule(true, "DREQ", Fate::Drop, 100);
    let (ca, _) = p.establish();
    p.a.disconnect(p.now, ca).unwrap();
    p.run_for(req_wait() * 4);
    assert_eq!(p.sent(true, "DREQ"), 4);
    assert!(p.ev_a.contains(&Event::Disconnected { conn: ca }));
    assert_eq!(p.a.state(ca), Some(State::Timewait));
}

#[test]
fn rejects_no_listener_consumer_and_stale() {
    // Nobody listens: REJ "invalid service ID", as rxe answers.
    let mut p = Pair::new();
    assert!(p.b.unlisten(sid()));
    let ca = p.connect();
    assert_eq!(
        p.ev_a,
        [Event::Rejected {
            conn: ca,
            reason: RejReason::InvalidServiceId
        }]
    );
    assert_eq!(p.a.state(ca), None);
    // The listener's consumer refuses, with private data.
    let mut p = Pair::new();
    let ca = p.connect();
    let (cb, _) = p.b_request();
    assert_eq!(
        p.b.reject(cb, RejReason::ConsumerReject, &[0u8; 149]),
        Err(CmError::PrivateDataTooLong(148))
    );
    p.b.reject(cb, RejReason::ConsumerReject, b"busy").unwrap();
    p.drive();
    assert_eq!(
        p.ev_a,
        [Event::Rejected {
            conn: ca,
            reason: RejReason::ConsumerReject
        }]
    );
    assert_eq!(p.b.state(cb), None);
    // The active side cannot use the REP (its QP failed to move): REJ of the REP.
    let mut p = Pair::new();
    let ca = p.connect();
    let (cb, _) = p.b_request();
    p.b.accept(p.now, cb, &accept_params()).unwrap();
    p.drive();
    p.a.reject(ca, RejReason::NoQp, &[]).unwrap();
    p.drive();
    assert!(p.ev_b.contains(&Event::Rejected {
        conn: cb,
        reason: RejReason::NoQp
    }));
    assert_eq!((p.a.state(ca), p.b.state(cb)), (None, None));
    // A REQ again from a connection in TIMEWAIT: REJ "stale connection".
    let mut p = Pair::new();
    let (ca, _) = p.establish();
    p.a.disconnect(p.now, ca).unwrap();
    p.drive();
    let req = p.log.iter().position(|l| l.1 == "REQ").unwrap();
    assert_eq!(req, 0);
    let (_, req) = p.b_request();
    let mut mad = [0u8; MAD_LEN];
    Message::Req(req).emit(9, &mut mad).unwrap();
    p.b.handle_mad(p.now, ip(A), &mad);
    let t = p.b.poll_transmit().unwrap();
    let Message::Rej(rej) = Message::parse(&t.mad).unwrap().1 else {
        panic!()
    };
    assert_eq!(rej.reason, RejReason::StaleConn);
    // The active side gives up before any answer (its consumer stopped waiting): the REQ is
    // withdrawn with REJ "timeout", our CA GUID in the ARI, naming no message; the listener
    // finds the connection by our ID and drops it; no REQ is sent again.
    let mut p = Pair::new();
    let ca = p.connect();
    let (cb, _) = p.b_request();
    p.a.reject(ca, RejReason::ConsumerReject, &[]).unwrap();
    let t = p.a.poll_transmit().unwrap();
    let Message::Rej(rej) = Message::parse(&t.mad).unwrap().1 else {
        panic!()
    };
    assert_eq!(
        (
            rej.reason,
            rej.message_rejected,
            rej.remote_comm_id,
            rej.ari_len
        ),
        (RejReason::Timeout, MsgKind::Other, 0, 8)
    );
    assert_eq!(rej.ari[..8], cfg(1).local_ca_guid.to_be_bytes());
    p.b.handle_mad(p.now, ip(A), &t.mad);
    p.drive();
    assert!(p.ev_b.contains(&Event::Rejected {
        conn: cb,
        reason: RejReason::Timeout
    }));
    assert_eq!((p.a.state(ca), p.b.state(cb)), (None, None));
    p.run_for(Duration::from_secs(60));
    assert_eq!(p.sent(true, "REQ"), 1);
    // A REJ "timeout" naming nobody B knows is counted and dropped.
    let before = p.b.counters().rx_unknown_conn;
    p.b.handle_mad(p.now, ip(A), &t.mad);
    assert_eq!(p.b.counters().rx_unknown_conn, before + 1);
}

#[test]
fn messages_for_connections_we_do_not_know() {
    let mut p = Pair::new();
    let (ca, cb) = p.establish();
    let send = |p: &mut Pair, m: Message| {
        let mut mad = [0u8; MAD_LEN];
        m.emit(77, &mut mad).unwrap();
        p.b.handle_mad(p.now, ip(A), &mad);
        p.b.poll_transmit()
            .map(|t| Message::parse(&t.mad).unwrap().1)
    };
    // A REP for a connection B never asked for: REJ "invalid comm ID".
    let rep = Rep {
        local_comm_id: 0x1234,
        remote_comm_id: 0xdead_0007,
        ..p.ev_a
            .iter()
            .find_map(|e| match e {
                Event::Reply { rep, .. } => Some(*rep),
                _ => None,
            })
            .unwrap()
    };
    let Some(Message::Rej(r)) = send(&mut p, Message::Rep(rep)) else {
        panic!()
    };
    assert_eq!(
        (r.reason, r.remote_comm_id),
        (RejReason::InvalidCommId, 0x1234)
    );
    // An RTU, an MRA, a REJ and a DREP for unknown IDs: dropped, counted.
    let ids = Ids {
        local_comm_id: 5,
        remote_comm_id: 0xdead_0007,
        private_data: [0; 224],
    };
    assert_eq!(send(&mut p, Message::Rtu(ids)), None);
    assert_eq!(send(&mut p, Message::Drep(ids)), None);
    assert_eq!(p.b.counters().rx_unknown_conn, 3);
    // A DREQ for an unknown connection is answered with a DREP (ours was lost).
    let dreq = Dreq {
        local_comm_id: 5,
        remote_comm_id: 0xdead_0007,
        remote_qpn: 0x22,
        private_data: [0; 220],
    };
    assert!(matches!(
        send(&mut p, Message::Dreq(dreq)),
        Some(Message::Drep(_))
    ));
    // A DREQ naming B's connection but from another remote ID is not B's: DREP, B stays up.
    let dreq = Dreq {
        remote_comm_id: cb.0,
        ..dreq
    };
    assert!(matches!(
        send(&mut p, Message::Dreq(dreq)),
        Some(Message::Drep(_))
    ));
    assert_eq!(p.b.state(cb), Some(State::Established));
    // Bytes that are no CM message.
    p.b.handle_mad(p.now, ip(A), &[1, 7, 2, 3]);
    let mut mad = [0u8; MAD_LEN];
    mad[0] = 1;
    mad[1] = 0x04;
    p.b.handle_mad(p.now, ip(A), &mad);
    assert_eq!(p.b.counters().rx_malformed, 2);
    assert_eq!(p.b.state(cb), Some(State::Established));
    assert_eq!(p.a.state(ca), Some(State::Established));
    // Commands in the wrong state.
    assert_eq!(p.a.establish(ca), Err(CmError::WrongState("ESTABLISHED")));
    assert_eq!(
        p.b.accept(p.now, ConnId(42), &accept_params()),
        Err(CmError::NoConn)
    );
}

#[test]
fn a_req_flood_drops_the_oldest_half_open_connections_first() {
    let mut b = Cm::new(Config {
        max_conns: 4,
        ..cfg(2)
    });
    b.listen(sid()).unwrap();
    let mut a = Cm::new(Config {
        max_conns: 16,
        ..cfg(1)
    });
    let t = |i: u64| Instant(1_000_000 * (i + 1));
    // One connection established, then six REQs that nobody at B answers.
    let mut conns = Vec::new();
    for i in 0..7 {
        conns.push(a.connect(t(i), &connect_params()).unwrap());
        let m = a.poll_transmit().unwrap();
        b.handle_mad(t(i), ip(A), &m.mad);
        if i == 0 {
            let Some(Event::Request { conn, .. }) = b.poll_event() else {
                panic!()
            };
            b.accept(t(0), conn, &accept_params()).unwrap();
            let rep = b.poll_transmit().unwrap();
            a.handle_mad(t(0), ip(B), &rep.mad);
            a.establish(conns[0]).unwrap();
            let rtu = a.poll_transmit().unwrap();
            b.handle_mad(t(0), ip(A), &rtu.mad);
        }
    }
    // Four slots: the established one stays; of the six half-open, the first three were pushed
    // out oldest first, by REQs 5, 6 and 7.
    assert_eq!(b.counters().evicted, 3);
    let evicted: Vec<_> = std::iter::from_fn(|| b.poll_event())
        .filter_map(|e| match e {
            Event::Evicted { conn } => Some(conn),
            _ => None,
        })
        .collect();
    assert_eq!(evicted.len(), 3);
    let states: Vec<State> = b.conns().map(|c| c.1).collect();
    assert_eq!(
        states.iter().filter(|s| **s == State::Established).count(),
        1
    );
    assert_eq!(states.len(), 4);
    // Every slot established: a new REQ is refused with "no resources".
    let mut b = Cm::new(Config {
        max_conns: 1,
        ..cfg(2)
    });
    b.listen(sid()).unwrap();
    let mut p = Pair::new();
    std::mem::swap(&mut p.b, &mut b);
    p.establish();
    let ca = p.connect();
    assert!(p.ev_a.contains(&Event::Rejected {
        conn: ca,
        reason: RejReason::NoResources
    }));
}

#[test]
fn sidr_resolves_answers_duplicates_and_times_out() {
    let mut p = Pair::new();
    let usid = service_id(PortSpace::Udp, 7174);
    p.b.listen(usid).unwrap();
    p.rule(true, "SIDR_REQ", Fate::Duplicate, 1);
    let ca =
        p.a.sidr_resolve(p.now, ip(B), usid, 0xffff, &[0; 216])
            .unwrap();
    p.drive();
    let reqs: Vec<ConnId> = p
        .ev_b
        .iter()
        .filter_map(|e| match e {
            Event::SidrRequest { conn, .. } => Some(*conn),
            _ => None,
        })
        .collect();
    assert_eq!(
        reqs.len(),
        1,
        "a duplicate SIDR_REQ is not a second request"
    );
    p.b.sidr_reply(p.now, reqs[0], SidrStatus::Ok, 0x14, 0x0123_4567)
        .unwrap();
    p.drive();
    let Some(Event::SidrResolved { conn, rep }) = p.ev_a.last().copied() else {
        panic!("{:?}", p.ev_a)
    };
    assert_eq!(
        (conn, rep.qpn, rep.qkey, rep.status),
        (ca, 0x14, 0x0123_4567, SidrStatus::Ok)
    );
    assert_eq!(rep.service_id, usid);
    // A SIDR_REQ again after the answer gets the answer again.
    let mut mad = [0u8; MAD_LEN];
    let (_, again) = Message::parse(&Cm::encode(
        &Message::SidrReq(SidrReq {
            request_id: ca.0,
            pkey: 0xffff,
            service_id: usid,
            private_data: [0; 216],
        }),
        1,
    ))
    .unwrap();
    again.emit(1, &mut mad).unwrap();
    p.b.handle_mad(p.now, ip(A), &mad);
    let t = p.b.poll_transmit().unwrap();
    assert!(matches!(Message::parse(&t.mad).unwrap().1, Message::SidrRep(r) if r.qpn == 0x14));
    // Nobody serves the service: status 1.
    let ca =
        p.a.sidr_resolve(p.now, ip(B), usid + 1, 0xffff, &[0; 216])
            .unwrap();
    p.drive();
    assert!(matches!(
        p.ev_a.last(),
        Some(Event::SidrResolved { conn, rep }) if *conn == ca && rep.status == SidrStatus::NoServiceId
    ));
    // Nobody answers at all.
    p.rule(true, "SIDR_REQ", Fate::Drop, 100);
    let ca =
        p.a.sidr_resolve(p.now, ip(B), usid, 0xffff, &[0; 216])
            .unwrap();
    p.run_for(req_wait() * 4);
    assert_eq!(p.ev_a.last(), Some(&Event::SidrUnreachable { conn: ca }));
}

#[test]
fn communication_ids_name_their_slot_and_a_stale_one_is_refused() {
    let mut cm = Cm::new(Config {
        max_conns: 2,
        ..cfg(3)
    });
    let a = cm.connect(Instant(0), &connect_params()).unwrap();
    let b = cm.connect(Instant(0), &connect_params()).unwrap();
    assert_eq!((a.0 & 0xffff, b.0 & 0xffff), (0, 1));
    assert_eq!(
        cm.connect(Instant(0), &connect_params()),
        Err(CmError::NoSlot)
    );
    // A gives up; its slot's next occupant has another ID, and the old one names nothing.
    let later = |i: u64| Instant(i * 10_000_000_000);
    // Three retries (cfg's max_cm_retries), then given up.
    for i in 1..=3 {
        cm.handle_timeout(later(i));
        assert_eq!(cm.state(a), Some(State::ReqSent), "retry {i}");
    }
    cm.handle_timeout(later(4));
    assert_eq!(cm.state(a), None);
    let c = cm.connect(later(4), &connect_params()).unwrap();
    assert_eq!(c.0 & 0xffff, 0);
    assert_ne!(c, a);
    assert_eq!(cm.state(a), None);
    assert_eq!(cm.disconnect(Instant(0), a), Err(CmError::NoConn));
    assert_eq!(cm.listen(1), Ok(()));
    assert_eq!(cm.listen(1), Err(CmError::Listening));
}

#[test]
fn the_ca_guid_is_the_macs_modified_eui64() {
    // rxe's node GUID for 52:54:00:e9:01:11 (the interop VM's NIC): 5054:00ff:fee9:0111.
    assert_eq!(
        ca_guid_of([0x52, 0x54, 0x00, 0xe9, 0x01, 0x11]),
        0x5054_00ff_fee9_0111
    );
    let mut p = Pair::new();
    p.a.set_local_ca_guid(0x0200_00ff_fe00_0099);
    p.connect();
    let (_, req) = p.b_request();
    assert_eq!(req.local_ca_guid, 0x0200_00ff_fe00_0099);
}

#[test]
fn timeouts_follow_ibta_encoding() {
    assert_eq!(timeout_of(0), Duration::from_nanos(4096));
    assert_eq!(timeout_of(20), Duration::from_nanos(4096 << 20));
    assert_eq!(timeout_of(24).as_secs(), 68);
    assert_eq!(timeout_of(200), timeout_of(31));
}

#[test]
fn seeded_operation_sequences_keep_the_invariants() {
    // xorshift bytes: 300 sequences of 600 operations (the fuzz target runs the same driver).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut total = ops::Outcome::default();
    for _ in 0..300 {
        let bytes: Vec<u8> = (0..2400)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let o = ops::apply(&bytes);
        total.established += o.established;
        total.mads += o.mads;
        total.retransmits += o.retransmits;
        total.duplicates += o.duplicates;
    }
    // The sequences reach every part: handshakes, resends, duplicates.
    assert!(total.established > 300, "{total:?}");
    assert!(
        total.retransmits > 300 && total.duplicates > 300,
        "{total:?}"
    );
}

#[test]
fn a_request_waits_the_listen_grace_for_its_listener() {
    let grace = Duration::from_millis(250);
    let with_grace = || {
        let mut p = Pair::new();
        p.b = Cm::new(Config {
            listen_grace: grace,
            ..cfg(2)
        });
        p
    };
    // The listener comes 100 ms after the REQ: B's consumer is asked then, and nothing was
    // refused; a retransmitted REQ meanwhile is a duplicate, not a second request.
    let mut p = with_grace();
    p.rule(true, "REQ", Fate::Duplicate, 1);
    let ca = p.connect();
    assert_eq!((p.sent(false, "REJ"), p.ev_b.len()), (0, 0));
    assert!(p.b.poll_timeout().is_some());
    p.run_for(Duration::from_millis(100));
    p.b.listen(sid()).unwrap();
    p.b.handle_timeout(p.now);
    p.drive();
    let (cb, req) = p.b_request();
    assert_eq!(req.service_id, sid());
    assert_eq!(p.ev_b.len(), 1, "{:?}", p.ev_b);
    p.b.accept(p.now, cb, &accept_params()).unwrap();
    p.drive();
    p.a.establish(ca).unwrap();
    p.drive();
    assert_eq!(p.b.state(cb), Some(State::Established));
    assert_eq!(p.sent(false, "REJ"), 0);
    // Nobody comes: the REQ is refused ("invalid service ID") when the grace is over, not
    // before.
    let mut p = with_grace();
    let t0 = p.now;
    let ca = p.connect();
    p.run_for(Duration::from_millis(249));
    assert_eq!(p.sent(false, "REJ"), 0);
    p.run_for(Duration::from_millis(10));
    assert_eq!(p.times(false, "REJ"), [t0 + grace]);
    assert_eq!(
        p.ev_a,
        [Event::Rejected {
            conn: ca,
            reason: RejReason::InvalidServiceId
        }]
    );
    // A flood of REQs for nobody holds at most max_orphans; the rest are refused at once.
    let mut p = with_grace();
    for _ in 0..70 {
        p.a.connect(p.now, &connect_params()).unwrap();
    }
    p.drive();
    assert_eq!(p.sent(false, "REJ"), 70 - 64);
    // Without a grace (the default), refused at once, as Linux's ib_cm.
    let mut p = Pair::new();
    assert!(p.b.unlisten(sid()));
    p.connect();
    assert_eq!(p.times(false, "REJ"), [p.now]);
}
