//! The attach socket's framing: how an application and roced exchange control verbs over a Unix
//! stream socket, with the descriptors of shared memory (and, later, completion-channel
//! eventfds) passed alongside as SCM_RIGHTS.
//!
//! A message is a 4-byte little-endian length, then that many bytes of JSON (control verbs are
//! rare next to the rings' traffic; JSON keeps them readable in a trace and versionable), sent
//! with one `sendmsg` that carries the message's descriptors. The kernel hands descriptors to
//! the `recvmsg` that reads the first byte they were sent with, so [`recv`] reads the length
//! with `recvmsg` and takes them there, then reads the body. A peer that sends more than
//! [`MAX_MESSAGE`] bytes, more than [`MAX_FDS`] descriptors, or bytes that are not a message
//! gets an error back from [`recv`], never a panic; descriptors that came with a bad message are
//! closed.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::unix::net::UnixStream;

/// Bytes one message may take.
pub const MAX_MESSAGE: usize = 64 << 10;
/// Descriptors one message may carry.
pub const MAX_FDS: usize = 32;

/// Why a message could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The socket failed.
    #[error("attach socket: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the socket.
    #[error("the peer closed the attach socket")]
    Closed,
    /// A message longer than [`MAX_MESSAGE`].
    #[error("a message of {0} bytes: at most {MAX_MESSAGE}")]
    TooLong(usize),
    /// More descriptors than [`MAX_FDS`], or descriptors cut off by the kernel.
    #[error("too many descriptors with one message (at most {MAX_FDS})")]
    TooManyFds,
    /// The bytes are not a message.
    #[error("not a message: {0}")]
    Malformed(String),
}

fn errno(e: rustix::io::Errno) -> AttachError {
    AttachError::Io(e.into())
}

/// Sends `msg` with `fds`.
pub fn send<T: Serialize>(
    sock: &UnixStream,
    msg: &T,
    fds: &[BorrowedFd<'_>],
) -> Result<(), AttachError> {
    if fds.len() > MAX_FDS {
        return Err(AttachError::TooManyFds);
    }
    let body = serde_json::to_vec(msg).map_err(|e| AttachError::Malformed(e.to_string()))?;
    if body.len() > MAX_MESSAGE {
        return Err(AttachError::TooLong(body.len()));
    }
    let len = (body.len() as u32).to_le_bytes();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(AttachError::TooManyFds);
    }
    let total = len.len() + body.len();
    let mut sent = rustix::net::sendmsg(
        sock.as_fd(),
        &[IoSlice::new(&len), IoSlice::new(&body)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(errno)?;
    // The rest of a message the socket took only in part (its descriptors went with the first).
    while sent < total {
        let rest: Vec<u8> = len.iter().chain(&body).skip(sent).copied().collect();
        let n = rustix::net::send(sock.as_fd(), &rest, SendFlags::NOSIGNAL).map_err(errno)?;
        sent += n;
    }
    Ok(())
}

/// Receives one message and the descriptors that came with it.
pub fn recv<T: DeserializeOwned>(sock: &UnixStream) -> Result<(T, Vec<OwnedFd>), AttachError> {
    let mut len = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(
        sock.as_fd(),
        &mut [IoSliceMut::new(&mut len)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(errno)?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    if r.flags.contains(rustix::net::ReturnFlags::CTRUNC) || fds.len() > MAX_FDS {
        return Err(AttachError::TooManyFds);
    }
    if r.bytes == 0 {
        return Err(AttachError::Closed);
    }
    let mut s = sock;
    if r.bytes < len.len() {
        s.read_exact(&mut len[r.bytes..])?;
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_MESSAGE {
        return Err(AttachError::TooLong(n));
    }
    let mut body = vec![0u8; n];
    s.read_exact(&mut body)?;
    let msg = serde_json::from_slice(&body).map_err(|e| AttachError::Malformed(e.to_string()))?;
    Ok((msg, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::SharedMem;
    use std::io::Write;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    enum Msg {
        Hello { pid: u32 },
        Ring { bytes: usize },
    }

    #[test]
    fn messages_and_shared_memory_cross_the_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        send(&a, &Msg::Hello { pid: 7 }, &[]).unwrap();
        let (m, fds): (Msg, _) = recv(&b).unwrap();
        assert_eq!((m, fds.len()), (Msg::Hello { pid: 7 }, 0));
        // Memory made on one side is mapped on the other and is the same memory.
        let mem = SharedMem::create("ferroce-attach-test", 4096).unwrap();
        send(&a, &Msg::Ring { bytes: 4096 }, &[mem.fd()]).unwrap();
        send(&a, &Msg::Hello { pid: 8 }, &[]).unwrap();
        let (m, mut fds): (Msg, _) = recv(&b).unwrap();
        assert_eq!((m, fds.len()), (Msg::Ring { bytes: 4096 }, 1));
        let theirs = SharedMem::map(fds.remove(0), 4096).unwrap();
        // SAFETY: both are live 4096-byte mappings; one write, then one read.
        unsafe {
            mem.as_ptr().add(9).write_volatile(0x77);
            assert_eq!(theirs.as_ptr().add(9).read_volatile(), 0x77);
        }
        // The next message's bytes did not carry the descriptor again.
        let (m, fds): (Msg, _) = recv(&b).unwrap();
        assert_eq!((m, fds.len()), (Msg::Hello { pid: 8 }, 0));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let (mut a, b) = UnixStream::pair().unwrap();
        // Not JSON of the message type.
        a.write_all(&5u32.to_le_bytes()).unwrap();
        a.write_all(b"hello").unwrap();
        assert!(matches!(recv::<Msg>(&b), Err(AttachError::Malformed(_))));
        // A length past the limit.
        a.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
        assert!(matches!(recv::<Msg>(&b), Err(AttachError::TooLong(_))));
        // Too many descriptors refused on the way out.
        let m = SharedMem::create("x", 64).unwrap();
        let too_many = vec![m.fd(); MAX_FDS + 1];
        assert!(matches!(
            send(&a, &Msg::Hello { pid: 1 }, &too_many),
            Err(AttachError::TooManyFds)
        ));
        // A peer that goes away.
        drop(a);
        assert!(matches!(recv::<Msg>(&b), Err(AttachError::Closed)));
    }
}
