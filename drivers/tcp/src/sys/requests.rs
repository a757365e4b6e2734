//! The requests the driver hands the kernel, one function each, saying
//! why the memory a request names outlives it; and how their completions
//! name them ([`Tag`], the connection's slot and generation, in the
//! `user_data`), taken from the ring once each ([`Cqe`]).
//!
//! What the memory arguments rest on (see also the [module docs](super)):
//! a connection's connect address and send batches live in its boxed
//! `Conn`, which the driver frees only once no request in flight names it
//! (`Conns::take_finished`: `in_flight == 0`, counted by the caller for
//! every request these functions queue), or never (a teardown that leaks,
//! `Conns::leak`); the receive buffers live as long as the ring
//! ([`Uring`]'s `Drop`).

use super::bufring::BUF_GROUP;
use super::mem::Span;
use super::send::SendQueue;
use super::uring::Uring;
use io_uring::{cqueue, opcode, squeue, types};
use nix::libc;
use nix::sys::socket::{SockaddrLike, SockaddrStorage};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// What a completion belongs to: the top byte of its `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Tag {
    /// The listener's multishot accept.
    Accept = 1,
    /// A lane's connect.
    Connect = 2,
    /// A connection's send.
    Send = 3,
    /// A connection's receive into the provided buffers (the multishot
    /// one or a busy one).
    Recv = 4,
    /// A cancellation (its result is not needed).
    Cancel = 5,
    /// A receive straight into registered memory (a large PUT's payload).
    Direct = 6,
}

/// `user_data` for `tag` on connection `slot` of generation `generation`.
pub(crate) fn user_data(tag: Tag, slot: u32, generation: u32) -> u64 {
    (tag as u64) << 56 | u64::from(slot & 0x00ff_ffff) << 32 | u64::from(generation)
}

/// The parts of a `user_data`; `None` for a tag this driver never sets.
pub(crate) fn parse_user_data(data: u64) -> Option<(Tag, u32, u32)> {
    let tag = match (data >> 56) as u8 {
        1 => Tag::Accept,
        2 => Tag::Connect,
        3 => Tag::Send,
        4 => Tag::Recv,
        5 => Tag::Cancel,
        6 => Tag::Direct,
        _ => return None,
    };
    Some((tag, (data >> 32) as u32 & 0x00ff_ffff, data as u32))
}

/// A connection's socket as its requests name it: by its entry in the
/// ring's fixed-file table when it has one (no descriptor lookup per
/// request), else by its descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Socket {
    /// Entry `.0` of the fixed-file table.
    Fixed(u32),
    /// The descriptor.
    Fd(RawFd),
}

/// Builds a request on `$socket` (a [`Socket`]), `$fd` naming it.
macro_rules! on_socket {
    ($socket:expr, |$fd:ident| $build:expr) => {
        match $socket {
            Socket::Fixed(index) => {
                let $fd = types::Fixed(index);
                $build
            }
            Socket::Fd(raw) => {
                let $fd = types::Fd(raw);
                $build
            }
        }
    };
}

/// One completion, as [`Uring::next`] takes it from the ring. Not
/// `Clone`: the descriptor of an accept is adopted once
/// ([`Cqe::into_accepted`]).
#[derive(Debug)]
pub(crate) struct Cqe(cqueue::Entry);

impl Cqe {
    pub(super) fn new(entry: cqueue::Entry) -> Cqe {
        Cqe(entry)
    }

    pub(crate) fn user_data(&self) -> u64 {
        self.0.user_data()
    }

    pub(crate) fn result(&self) -> i32 {
        self.0.result()
    }

    pub(crate) fn flags(&self) -> u32 {
        self.0.flags()
    }

    /// The descriptor a successful accept returned, ours from now on;
    /// `None` for any other completion (a failed accept, another request).
    pub(crate) fn into_accepted(self) -> Option<OwnedFd> {
        let accepted = matches!(parse_user_data(self.user_data()), Some((Tag::Accept, _, _)));
        let fd = self.result();
        if !accepted || fd < 0 {
            return None;
        }
        // SAFETY: the result of a successful accept (only the listener's
        // accept is tagged `Accept`) is a new descriptor nothing else owns;
        // this completion was taken from the ring once and is consumed here,
        // so it is adopted once.
        Some(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Uring {
    /// The listener's multishot accept.
    pub(crate) fn accept_multi(&mut self, listener: BorrowedFd<'_>, user_data: u64) -> bool {
        let entry = opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd()))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data);
        // SAFETY: the entry names no memory (the peer's address is not
        // asked for).
        unsafe { self.push(&entry) }.is_ok()
    }

    /// Cancels every request on descriptor `fd`.
    pub(crate) fn cancel_fd(&mut self, fd: RawFd, user_data: u64) -> bool {
        let entry = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all())
            .build()
            .user_data(user_data);
        // SAFETY: a cancellation names no memory.
        unsafe { self.push(&entry) }.is_ok()
    }

    /// Cancels the request whose `user_data` is `target`.
    pub(crate) fn cancel(&mut self, target: u64, user_data: u64) -> bool {
        let entry = opcode::AsyncCancel::new(target)
            .build()
            .user_data(user_data);
        // SAFETY: a cancellation names no memory.
        unsafe { self.push(&entry) }.is_ok()
    }

    /// A lane's connect to `addr`, which the kernel reads until the
    /// connect completes: the caller keeps it in the connection (see the
    /// module docs).
    pub(crate) fn connect(
        &mut self,
        socket: Socket,
        addr: &SockaddrStorage,
        user_data: u64,
    ) -> bool {
        let entry = on_socket!(socket, |fd| opcode::Connect::new(
            fd,
            addr.as_ptr(),
            addr.len()
        )
        .build())
        .user_data(user_data);
        // SAFETY: the address lives in the boxed connection, which is freed
        // only after this request completes (module docs).
        unsafe { self.push(&entry) }.is_ok()
    }

    /// Starts sending the filled batch of `send` (the connection's send
    /// queue) if nothing is in flight and it holds bytes; `true` if the
    /// send was queued.
    pub(crate) fn send(&mut self, socket: Socket, send: &mut SendQueue, user_data: u64) -> bool {
        let Some(msg) = send.start() else {
            return false;
        };
        self.push_send(socket, msg, user_data)
    }

    /// Sends what is left of the batch in flight, after a send that moved
    /// part of it (`Sent::More`).
    pub(crate) fn send_rest(
        &mut self,
        socket: Socket,
        send: &mut SendQueue,
        user_data: u64,
    ) -> bool {
        let msg = send.rest();
        self.push_send(socket, msg, user_data)
    }

    fn push_send(&mut self, socket: Socket, msg: *const libc::msghdr, user_data: u64) -> bool {
        let entry = on_socket!(socket, |fd| opcode::SendMsg::new(fd, msg)
            .flags((libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32)
            .build())
        .user_data(user_data);
        // SAFETY: the msghdr, its iovecs and the staging they point into
        // live in the batch in flight (boxed, in the boxed connection, which
        // is freed only after this request completes: module docs),
        // untouched until `SendQueue::sent` hears of this send's
        // completion. Iovecs over memory the driver does not own stay
        // readable until then: an operation's local memory
        // (`SendQueue::push_local` says until when) and a window's
        // GET data (`SendQueue::push_window`: deregistration waits).
        unsafe { self.push(&entry) }.is_ok()
    }

    /// The multishot receive of `socket` into the provided buffers.
    pub(crate) fn recv_multi(&mut self, socket: Socket, user_data: u64) -> bool {
        let entry = on_socket!(socket, |fd| opcode::RecvMulti::new(fd, BUF_GROUP).build())
            .user_data(user_data);
        // SAFETY: the receive writes only into provided buffers, which live
        // as long as the ring.
        unsafe { self.push(&entry) }.is_ok()
    }

    /// One nonblocking receive of `socket` into a provided buffer: it takes
    /// what is there or fails with EAGAIN inside the `io_uring_enter` that
    /// submits it, and arms no poll.
    pub(crate) fn recv_busy(&mut self, socket: Socket, user_data: u64) -> bool {
        let entry = on_socket!(socket, |fd| opcode::Recv::new(fd, std::ptr::null_mut(), 0)
            .buf_group(BUF_GROUP)
            .flags(libc::MSG_DONTWAIT)
            .build())
        .flags(squeue::Flags::BUFFER_SELECT)
        .user_data(user_data);
        // SAFETY: the receive writes only into a provided buffer (no buffer
        // of its own: null, 0 bytes), which lives as long as the ring.
        unsafe { self.push(&entry) }.is_ok()
    }

    /// A receive of exactly `span` (the rest of a large PUT's payload)
    /// straight into its window.
    pub(crate) fn recv_direct(&mut self, socket: Socket, span: Span, user_data: u64) -> bool {
        let dst = span.addr() as usize as *mut u8;
        let entry = on_socket!(socket, |fd| opcode::Recv::new(fd, dst, span.len())
            .flags(libc::MSG_WAITALL)
            .build())
        .user_data(user_data);
        // SAFETY: `span` lies inside a registered window, checked when the
        // PUT's header came; its memory stays until this receive completes:
        // `quiesce` of a deregistered window answers `Pending` while a
        // connection's direct receive into it is in flight (`holds_key`), or
        // `Leak`.
        unsafe { self.push(&entry) }.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips() {
        for (tag, slot, generation) in [
            (Tag::Accept, 0, 0),
            (Tag::Send, 0x00ff_ffff, u32::MAX),
            (Tag::Recv, 12, 7),
            (Tag::Cancel, 1, 1),
            (Tag::Connect, 99, 3),
            (Tag::Direct, 5, 9),
        ] {
            assert_eq!(
                parse_user_data(user_data(tag, slot, generation)),
                Some((tag, slot, generation))
            );
        }
        assert_eq!(parse_user_data(0), None);
        assert_eq!(parse_user_data(u64::MAX), None);
    }

    #[test]
    fn only_a_successful_accept_hands_over_a_descriptor() {
        let mut u = Uring::new(8, 2, 4096).unwrap();
        let nop = |u: &mut Uring, data: u64| {
            let nop = opcode::Nop::new().build().user_data(data);
            // SAFETY: a NOP names no memory.
            unsafe { u.push(&nop) }.unwrap();
            u.submit().unwrap();
            u.next().unwrap()
        };
        // A NOP completes with 0, which would be descriptor 0.
        assert!(
            nop(&mut u, user_data(Tag::Send, 1, 1))
                .into_accepted()
                .is_none()
        );
        assert!(
            nop(&mut u, user_data(Tag::Cancel, 0, 0))
                .into_accepted()
                .is_none()
        );
    }
}
