//! Two CMs driven by an arbitrary sequence of operations: the consumers' commands (connect,
//! accept, reject, establish, disconnect, SIDR, listen changes) on any connection ID, MADs
//! delivered, dropped, duplicated or reordered, MADs forged from the bytes (any attribute,
//! any IDs) and time passing. libFuzzer runs it from its bytes (`fuzz/fuzz_targets/cm_ops.rs`)
//! and the tests from a seeded generator.
//!
//! What must hold whatever the sequence:
//! - nothing panics, and commands on IDs that are not (or no longer) a connection are refused;
//! - state stays bounded: never more connections than slots, queues never past their size;
//! - no connection is reported established twice, and none after it is gone;
//! - liveness: once the wire is lossless and each consumer answers every request, running the
//!   clock on leaves no connection in a state with a timer (REQ/REP/DREQ/SIDR_REQ sent,
//!   TIMEWAIT): every wait ends.

use super::*;
use std::collections::HashSet;

const SLOTS: usize = 8;
const QUEUE: usize = 32;

#[derive(Debug)]
struct Side {
    cm: Cm,
    ip: IpAddr,
    /// In-flight MADs to the other side.
    wire: VecDeque<[u8; MAD_LEN]>,
    /// Connections this side was told about, newest last (targets for commands).
    known: Vec<ConnId>,
    established: HashSet<ConnId>,
    /// Connections reported gone.
    gone: HashSet<ConnId>,
    requests: Vec<ConnId>,
    replies: Vec<ConnId>,
    sidr: Vec<ConnId>,
}

impl Side {
    fn new(seed: u64, ip: IpAddr) -> Side {
        let mut cm = Cm::new(Config {
            max_conns: SLOTS,
            queue: QUEUE,
            max_listens: 4,
            max_cm_retries: 2,
            seed,
            // One side holds requests for services it does not listen on (roced's), the
            // other refuses them at once (ib_cm's).
            listen_grace: if seed.is_multiple_of(2) {
                Duration::from_millis(250)
            } else {
                Duration::ZERO
            },
            max_orphans: 4,
            ..Config::default()
        });
        cm.listen(SID).expect("a fresh CM listens");
        cm.listen(USID).expect("a fresh CM listens");
        Side {
            cm,
            ip,
            wire: VecDeque::new(),
            known: Vec::new(),
            established: HashSet::new(),
            gone: HashSet::new(),
            requests: Vec::new(),
            replies: Vec::new(),
            sidr: Vec::new(),
        }
    }

    /// Takes the CM's MADs onto the wire and its events into the books, checking them.
    fn collect(&mut self) {
        while let Some(t) = self.cm.poll_transmit() {
            self.wire.push_back(t.mad);
        }
        while let Some(e) = self.cm.poll_event() {
            match e {
                Event::Request { conn, .. } => self.requests.push(conn),
                Event::Reply { conn, .. } => self.replies.push(conn),
                Event::SidrRequest { conn, .. } => self.sidr.push(conn),
                Event::Established { conn } => {
                    assert!(self.established.insert(conn), "{conn:?} established twice");
                    assert!(!self.gone.contains(&conn), "{conn:?} established once gone");
                }
                Event::TimewaitExit { conn }
                | Event::Rejected { conn, .. }
                | Event::Unreachable { conn }
                | Event::Evicted { conn }
                | Event::SidrResolved { conn, .. }
                | Event::SidrUnreachable { conn } => {
                    assert_eq!(self.cm.state(conn), None, "{e:?}: the connection is gone");
                    self.gone.insert(conn);
                }
                Event::Disconnected { .. } => {}
            }
            if let Some(c) = conn_of(&e) {
                if self.known.len() == 64 {
                    self.known.remove(0);
                }
                self.known.push(c);
            }
        }
        assert!(self.cm.conns().count() <= SLOTS);
        assert!(self.cm.tx.len() <= QUEUE && self.cm.events.len() <= QUEUE);
        assert!(self.cm.orphans.len() <= 4);
    }

    fn pick(&self, list: &[ConnId], b: u8) -> ConnId {
        list.get(b as usize % list.len().max(1))
            .copied()
            .unwrap_or(ConnId(u32::from(b) << 16 | u32::from(b & 7)))
    }
}

const SID: u64 = 0x0106_1d2f;
const USID: u64 = 0x0111_1c06;

fn conn_of(e: &Event) -> Option<ConnId> {
    match *e {
        Event::Request { conn, .. }
        | Event::Reply { conn, .. }
        | Event::Established { conn }
        | Event::Rejected { conn, .. }
        | Event::Unreachable { conn }
        | Event::Disconnected { conn }
        | Event::TimewaitExit { conn }
        | Event::Evicted { conn }
        | Event::SidrRequest { conn, .. }
        | Event::SidrResolved { conn, .. }
        | Event::SidrUnreachable { conn } => Some(conn),
    }
}

fn params(peer: IpAddr, b: u8) -> ConnectParams {
    let sid = if b & 1 == 0 { SID } else { SID + 1 };
    ConnectParams {
        private_data: [b; cm::private_len::REQ],
        ..ConnectParams::new(sid, peer, Path::default(), u32::from(b), u32::from(b) << 8)
    }
}

fn accept(b: u8) -> AcceptParams {
    AcceptParams {
        private_data: [b; cm::private_len::REP],
        ..AcceptParams::new(u32::from(b), 1)
    }
}

/// What a run did (so that a test can tell it exercised something).
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    /// Connections established, both sides.
    pub established: usize,
    /// MADs handled, both sides.
    pub mads: u64,
    /// Retransmissions, both sides.
    pub retransmits: u64,
    /// Duplicates answered or ignored, both sides.
    pub duplicates: u64,
}

/// Applies the operations `data` encodes, then checks liveness.
pub fn apply(data: &[u8]) -> Outcome {
    let ips: [IpAddr; 2] = ["10.0.0.1".parse().unwrap(), "fd00::2".parse().unwrap()];
    let mut s = [Side::new(1, ips[0]), Side::new(2, ips[1])];
    let mut now = Instant(1_000_000_000);
    let mut it = data.chunks_exact(4);
    for op in it.by_ref() {
        let (code, x, y, z) = (op[0], op[1], op[2], op[3]);
        let me = (code & 0x80 != 0) as usize;
        let other = 1 - me;
        let peer = s[other].ip;
        let side = &mut s[me];
        // Results are ignored: a refused command is a valid outcome; the engine's state is
        // what the checks look at.
        match code & 0x7f {
            0..=9 => {
                let _ = side.cm.connect(now, &params(peer, x));
            }
            10..=14 => {
                let c = side.pick(&side.requests, x);
                let _ = side.cm.accept(now, c, &accept(y));
            }
            15..=17 => {
                let c = side.pick(&side.requests, x);
                let _ = side
                    .cm
                    .reject(c, RejReason::from_code(u16::from(y)), &[z; 4]);
            }
            18..=22 => {
                let c = side.pick(&side.replies, x);
                let _ = side.cm.establish(c);
            }
            23..=25 => {
                let c = side.pick(&side.known, x);
                let _ = side.cm.disconnect(now, c);
            }
            26..=27 => {
                let sid = if y & 1 == 0 { USID } else { USID + 1 };
                let _ = side.cm.sidr_resolve(now, peer, sid, 0xffff, &[z; 216]);
            }
            28..=29 => {
                let c = side.pick(&side.sidr, x);
                let _ = side
                    .cm
                    .sidr_reply(now, c, SidrStatus::Ok, u32::from(y), 0x0123_4567);
            }
            30 => {
                if x & 1 == 0 {
                    side.cm.unlisten(SID);
                } else {
                    let _ = side.cm.listen(SID);
                }
            }
            31..=35 => {
                let arbitrary = ConnId(u32::from_be_bytes([x, y, z, code]));
                let _ = side.cm.accept(now, arbitrary, &accept(x));
                let _ = side.cm.disconnect(now, arbitrary);
                let _ = side.cm.establish(arbitrary);
            }
            // The wire: deliver, drop, duplicate, reorder the next MADs from `me`.
            36..=69 => {
                for _ in 0..=(x & 3) {
                    if let Some(m) = s[me].wire.pop_front() {
                        s[other].cm.handle_mad(now, ips[me], &m);
                    }
                }
            }
            70..=74 => {
                s[me].wire.pop_front();
            }
            75..=78 => {
                if let Some(m) = s[me].wire.front().copied() {
                    s[other].cm.handle_mad(now, ips[me], &m);
                }
            }
            79..=81 => {
                if s[me].wire.len() > 1 {
                    s[me].wire.swap(0, 1);
                }
            }
            // A forged MAD: a real one from this side with bytes changed (an attribute, an ID,
            // a state field), or pure bytes.
            82..=95 => {
                let mut m = s[me].wire.front().copied().unwrap_or([x; MAD_LEN]);
                m[(usize::from(y) % (MAD_LEN - 16)) + 16] = z;
                if x & 1 == 1 {
                    m[17] = 0x10 + (z % 9);
                }
                s[other].cm.handle_mad(now, ips[me], &m);
            }
            96..=111 => {
                let step = u64::from(u16::from_be_bytes([x, y])) << (z % 24);
                now = now + Duration::from_nanos(step);
                for side in &mut s {
                    side.cm.handle_timeout(now);
                }
            }
            _ => {
                if let Some(t) = s[me].cm.poll_timeout() {
                    now = now.max(t);
                    s[me].cm.handle_timeout(now);
                }
            }
        }
        for side in &mut s {
            side.collect();
        }
    }
    // Liveness: lossless from here, every request accepted, every reply established.
    for side in &mut s {
        let _ = side.cm.listen(SID);
    }
    for _ in 0..2000 {
        let mut moved = false;
        for me in 0..2 {
            while let Some(m) = s[me].wire.pop_front() {
                moved = true;
                s[1 - me].cm.handle_mad(now, ips[me], &m);
            }
        }
        for side in &mut s {
            side.collect();
            for c in std::mem::take(&mut side.requests) {
                let _ = side.cm.accept(now, c, &accept(1));
            }
            for c in std::mem::take(&mut side.replies) {
                let _ = side.cm.establish(c);
            }
            for c in std::mem::take(&mut side.sidr) {
                let _ = side.cm.sidr_reply(now, c, SidrStatus::Ok, 1, 1);
            }
            side.collect();
        }
        if !moved {
            let next = s.iter().filter_map(|x| x.cm.poll_timeout()).min();
            let Some(t) = next else { break };
            now = now.max(t);
            for side in &mut s {
                side.cm.handle_timeout(now);
            }
        }
    }
    for side in &s {
        assert!(
            side.cm.orphans.is_empty(),
            "requests still waiting for a listener with the clock run on"
        );
        for (c, st, _, _) in side.cm.conns() {
            assert!(
                !matches!(
                    st,
                    State::ReqSent
                        | State::MraReqRcvd
                        | State::RepSent
                        | State::DreqSent
                        | State::Timewait
                        | State::SidrReqSent
                ),
                "{c:?} still {} with the wire lossless and the clock run on",
                st.name()
            );
        }
    }
    let mut o = Outcome::default();
    for side in &s {
        let c = side.cm.counters();
        o.established += side.established.len();
        o.mads += c.rx;
        o.retransmits += c.retransmits;
        o.duplicates += c.rx_duplicate;
    }
    o
}
