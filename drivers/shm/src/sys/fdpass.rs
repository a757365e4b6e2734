//! Messages with descriptors attached (`SCM_RIGHTS`) on unix sockets.

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The most descriptors one message carries; more are closed on receipt
/// and the message refused.
pub(crate) const MAX_FDS: usize = 2;

/// Sends one message, `data` with `fds` attached, without blocking if
/// `nonblocking`.
///
/// # Errors
/// `sendmsg` failed or sent less than `data` (a message socket sends
/// whole messages or nothing).
pub(crate) fn send(
    socket: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
    nonblocking: bool,
) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(data)];
    let mut flags = MsgFlags::MSG_NOSIGNAL;
    if nonblocking {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    let sent = sendmsg::<()>(
        socket.as_raw_fd(),
        &iov,
        if raw.is_empty() { &[] } else { &cmsg },
        flags,
        None,
    )?;
    if sent != data.len() {
        return Err(io::Error::other("short sendmsg on a message socket"));
    }
    Ok(())
}

/// One received message: its length (it was truncated if longer than the
/// buffer) and the descriptors that came with it, owned and close-on-exec.
#[derive(Debug)]
pub(crate) struct Received {
    /// Bytes written into the buffer.
    pub len: usize,
    /// The message was longer than the buffer.
    pub truncated: bool,
    /// Attached descriptors.
    pub fds: Vec<OwnedFd>,
}

/// Receives one message into `data`, without blocking if `nonblocking`.
///
/// # Errors
/// `recvmsg` failed (`WouldBlock` when nothing is there), the peer hung
/// up (`UnexpectedEof`), or more descriptors came than a message may carry
/// (they are closed).
pub(crate) fn recv(
    socket: BorrowedFd<'_>,
    data: &mut [u8],
    nonblocking: bool,
) -> io::Result<Received> {
    let mut iov = [IoSliceMut::new(data)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut flags = MsgFlags::MSG_CMSG_CLOEXEC;
    if nonblocking {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    let msg = recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), flags)?;
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
    let (len, msg_flags) = (msg.bytes, msg.flags);
    if msg_flags.contains(MsgFlags::MSG_CTRUNC) || fds.len() > MAX_FDS {
        return Err(io::Error::other("too many descriptors in one message"));
    }
    if len == 0 && fds.is_empty() {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    Ok(Received {
        len,
        truncated: msg_flags.contains(MsgFlags::MSG_TRUNC),
        fds,
    })
}
