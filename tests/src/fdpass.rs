//! Passing descriptors (and a few bytes) over a unix socket with
//! `SCM_RIGHTS`.
#![allow(unsafe_code)]

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 8;

/// Sends `data` with `fds` attached.
///
/// # Errors
/// `sendmsg` failed.
pub fn send(socket: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(data)];
    let sent = sendmsg::<()>(
        socket.as_raw_fd(),
        &iov,
        if raw.is_empty() { &[] } else { &cmsg },
        MsgFlags::empty(),
        None,
    )?;
    if sent != data.len() {
        return Err(io::Error::other(format!(
            "sendmsg sent {sent} of {} bytes",
            data.len()
        )));
    }
    Ok(())
}

/// Receives one message into `data` and returns its length and the
/// descriptors that came with it (owned, close-on-exec).
///
/// # Errors
/// `recvmsg` failed, the peer hung up, or the control data was truncated.
pub fn recv(socket: &UnixStream, data: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = [IoSliceMut::new(data)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            for fd in raw {
                // SAFETY: the kernel just installed `fd` in this process for
                // this message; nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::other("descriptor list truncated"));
    }
    let len = msg.bytes;
    if len == 0 && fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed the socket",
        ));
    }
    Ok((len, fds))
}
