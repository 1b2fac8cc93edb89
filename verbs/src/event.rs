//! Asynchronous events: what a device tells an application outside its completions (a QP or CQ
//! gone into error through no verb of its own, a port going down or coming up), as
//! `ibv_get_async_event` reports them.
//!
//! roced sends them on a socket of their own, one message each, given to the application with
//! `Welcome`: a `SOCK_SEQPACKET` pair, roced keeping one end and the application the other, so
//! the application's end is the pollable `async_fd` a libibverbs context has, readable while
//! events wait, and reads end of file when roced has gone (the device is lost:
//! `IBV_EVENT_DEVICE_FATAL`). roced never blocks on it: a message that does not fit (an
//! application that never reads its events) is dropped, and counted by the sender.
//!
//! A message is 8 bytes: the event's `IBV_EVENT_*` number, then what it concerns (a QP number,
//! a CQ's number in the session, or a port number from 1), both u32 little-endian.

use rustix::fd::{AsFd, OwnedFd};
use rustix::net::{
    AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType, recv, send, socketpair,
};

/// Bytes of one event message.
pub const EVENT_BYTES: usize = 8;

/// The events ferroce raises, numbered as libibverbs' `enum ibv_event_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum EventKind {
    /// A CQ's completion ring was abandoned (its consumer index impossible): it takes no more
    /// completions (`IBV_EVENT_CQ_ERR`).
    CqErr = 0,
    /// A QP was put in error for a fault of its own queues, which no completion can report (a
    /// producer index past its ring) (`IBV_EVENT_QP_FATAL`).
    QpFatal = 1,
    /// The device is lost: roced has gone (`IBV_EVENT_DEVICE_FATAL`; made by the application's
    /// side when its end reads end of file).
    DeviceFatal = 8,
    /// The port's link came up (`IBV_EVENT_PORT_ACTIVE`).
    PortActive = 9,
    /// The port's link went down (`IBV_EVENT_PORT_ERR`).
    PortErr = 10,
}

impl EventKind {
    fn from_u32(v: u32) -> Option<EventKind> {
        Some(match v {
            0 => EventKind::CqErr,
            1 => EventKind::QpFatal,
            8 => EventKind::DeviceFatal,
            9 => EventKind::PortActive,
            10 => EventKind::PortErr,
            _ => return None,
        })
    }
}

/// One event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// To what: a QP number (QP events), a CQ's number in the session (CQ events), a port
    /// number from 1 (port events); 0 for the device.
    pub element: u32,
}

impl Event {
    /// Its message.
    pub fn encode(&self) -> [u8; EVENT_BYTES] {
        let mut b = [0; EVENT_BYTES];
        b[..4].copy_from_slice(&(self.kind as u32).to_le_bytes());
        b[4..].copy_from_slice(&self.element.to_le_bytes());
        b
    }

    /// The event a message carries; None for one that is not an event (the wrong length, an
    /// unknown number).
    pub fn decode(b: &[u8]) -> Option<Event> {
        let b: &[u8; EVENT_BYTES] = b.try_into().ok()?;
        let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Some(Event {
            kind: EventKind::from_u32(word(0))?,
            element: word(4),
        })
    }
}

/// A new event socket pair: (roced's end, non-blocking; the application's end).
pub fn pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (mine, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    // The application's end blocks, as an async_fd does until the program says otherwise.
    let flags = rustix::fs::fcntl_getfl(&theirs)?;
    rustix::fs::fcntl_setfl(&theirs, flags - rustix::fs::OFlags::NONBLOCK)?;
    Ok((mine, theirs))
}

/// Sends `e` on roced's end; false if it was not sent (the application's end full or closed).
pub fn post(fd: impl AsFd, e: Event) -> bool {
    matches!(
        send(fd, &e.encode(), SendFlags::DONTWAIT | SendFlags::NOSIGNAL),
        Ok(EVENT_BYTES)
    )
}

/// What reading the application's end gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// An event.
    Event(Event),
    /// roced has gone (end of file).
    Gone,
    /// Nothing waiting (a non-blocking end, or `wait` ran out).
    Nothing,
}

/// Reads the next event from the application's end `fd`, waiting at most `wait` (None: as the
/// descriptor's own blocking mode says). Messages that are not events are skipped.
pub fn read(fd: impl AsFd, wait: Option<std::time::Duration>) -> std::io::Result<Read> {
    let fd = fd.as_fd();
    loop {
        if let Some(w) = wait {
            let mut p = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            let t = rustix::event::Timespec {
                tv_sec: w.as_secs() as i64,
                tv_nsec: w.subsec_nanos() as i64,
            };
            if rustix::event::poll(&mut p, Some(&t))? == 0 {
                return Ok(Read::Nothing);
            }
        }
        let mut b = [0u8; 64];
        let flags = if wait.is_some() {
            RecvFlags::DONTWAIT
        } else {
            RecvFlags::empty()
        };
        match recv(fd, &mut b, flags) {
            Ok((0, _)) => return Ok(Read::Gone),
            Ok((n, _)) => {
                if let Some(e) = Event::decode(&b[..n.min(b.len())]) {
                    return Ok(Read::Event(e));
                }
            }
            Err(rustix::io::Errno::AGAIN) => return Ok(Read::Nothing),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn events_cross_the_pair_and_its_end_reads_gone_when_roced_goes() {
        let (mine, theirs) = pair().unwrap();
        let e = Event {
            kind: EventKind::QpFatal,
            element: 0x11,
        };
        assert!(post(&mine, e));
        assert_eq!(read(&theirs, None).unwrap(), Read::Event(e));
        assert_eq!(
            read(&theirs, Some(Duration::from_millis(10))).unwrap(),
            Read::Nothing
        );
        // Something that is no event is skipped.
        send(&mine, &[1, 2, 3], SendFlags::empty()).unwrap();
        assert!(post(
            &mine,
            Event {
                kind: EventKind::PortErr,
                element: 1
            }
        ));
        assert!(matches!(
            read(&theirs, Some(Duration::from_millis(100))).unwrap(),
            Read::Event(Event {
                kind: EventKind::PortErr,
                ..
            })
        ));
        // roced never blocks: an application that never reads loses events, not roced's time.
        let sent = (0..100_000).take_while(|_| post(&mine, e)).count();
        assert!(sent < 100_000, "the socket never filled");
        drop(mine);
        let mut drained = 0;
        while let Read::Event(_) = read(&theirs, None).unwrap() {
            drained += 1;
        }
        assert_eq!(drained, sent);
        assert_eq!(read(&theirs, None).unwrap(), Read::Gone);
        assert_eq!(Event::decode(&[9, 9, 0, 0, 1, 0, 0, 0]), None);
    }
}
