//! A connection's outgoing bytes: two batches, one filling while the other
//! is in the kernel.
//!
//! A batch is a list of iovecs over its own staging buffer (frame headers,
//! small payloads, GET data) and over memory the driver does not own:
//! large PUT payloads ([`Local`]), sent without a copy, which the engine
//! keeps alive until the operation completes, and GET data a target sends
//! from its window ([`Span`]), which the driver's `quiesce` keeps alive
//! (the batch records the window). At the end of a round the filled batch
//! goes out as one `sendmsg` with `MSG_WAITALL` (the kernel keeps sending
//! until all of it is gone or the connection fails); while it is in flight
//! the other batch fills.
//!
//! The msghdr and iovecs never leave `sys`: [`Uring::send`] and
//! [`Uring::send_rest`] hand them to the kernel.
//!
//! [`Uring::send`]: super::uring::Uring::send
//! [`Uring::send_rest`]: super::uring::Uring::send_rest

use super::mem::{Local, Span};
use nix::libc;

/// One batch: staging bytes and the iovecs of a `sendmsg`.
struct Batch {
    buf: Box<[u8]>,
    used: usize,
    iovs: Vec<libc::iovec>,
    /// First iovec not yet sent (partial sends).
    first: usize,
    /// Bytes in the batch still to send.
    total: usize,
    /// The registrations whose windows iovecs of this batch read (GET data
    /// sent by reference), each once.
    windows: Vec<u32>,
    /// An iovec of this batch reads an operation's local memory (a large
    /// PUT's payload).
    locals: bool,
    msg: libc::msghdr,
}

impl Batch {
    fn new(bytes: usize, iovs: usize) -> Box<Batch> {
        Box::new(Batch {
            buf: vec![0u8; bytes].into_boxed_slice(),
            used: 0,
            iovs: Vec::with_capacity(iovs),
            first: 0,
            total: 0,
            windows: Vec::with_capacity(8),
            locals: false,
            // SAFETY: an all-zero msghdr is a valid empty one.
            msg: unsafe { std::mem::zeroed() },
        })
    }

    fn is_empty(&self) -> bool {
        self.total == 0
    }

    fn clear(&mut self) {
        self.used = 0;
        self.iovs.clear();
        self.first = 0;
        self.total = 0;
        self.windows.clear();
        self.locals = false;
    }

    /// Appends an iovec over `[base, base + len)`, merged with the last one
    /// when contiguous.
    fn push_iov(&mut self, base: *mut u8, len: usize) {
        if let Some(last) = self.iovs.last_mut() {
            // `wrapping_add`: only compared, never dereferenced.
            if (last.iov_base as *mut u8).wrapping_add(last.iov_len) == base {
                last.iov_len += len;
                self.total += len;
                return;
            }
        }
        self.iovs.push(libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        });
        self.total += len;
    }

    /// The msghdr for what is left to send.
    fn prepare(&mut self) -> *const libc::msghdr {
        let rest = &mut self.iovs[self.first..];
        self.msg.msg_iov = rest.as_mut_ptr();
        self.msg.msg_iovlen = rest.len();
        &self.msg
    }

    /// `n` more bytes went out; returns whether the batch is done.
    fn advance(&mut self, mut n: usize) -> bool {
        self.total -= n.min(self.total);
        while n > 0 {
            let Some(iov) = self.iovs.get_mut(self.first) else {
                break;
            };
            if n < iov.iov_len {
                iov.iov_base = (iov.iov_base as *mut u8).wrapping_add(n).cast();
                iov.iov_len -= n;
                break;
            }
            n -= iov.iov_len;
            self.first += 1;
        }
        self.total == 0
    }
}

/// A connection's send side.
pub(crate) struct SendQueue {
    batches: [Box<Batch>; 2],
    /// The batch being filled.
    open: usize,
    /// The other batch is in the kernel (a send is in flight).
    sending: bool,
    /// Room of the filling batch that requests may not take: (bytes,
    /// iovecs) kept for answers on a connection that carries requests both
    /// ways.
    reserve: (usize, usize),
}

// SAFETY: the raw pointers in the iovecs and msghdrs point into the
// batches' own boxed buffers or into registered memory the engine keeps
// alive; none is tied to a thread.
unsafe impl Send for SendQueue {}

impl std::fmt::Debug for SendQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendQueue")
            .field("queued", &self.queued())
            .field("sending", &self.sending)
            .finish()
    }
}

/// What a send completion leaves to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// The batch is gone; nothing is in flight.
    Done,
    /// Part of it remains, to send again ([`Uring::send_rest`]).
    ///
    /// [`Uring::send_rest`]: super::uring::Uring::send_rest
    More,
}

impl SendQueue {
    /// Batches of `bytes` staging bytes and `iovs` iovecs each.
    pub(crate) fn new(bytes: usize, iovs: usize) -> SendQueue {
        SendQueue {
            batches: [Batch::new(bytes, iovs), Batch::new(bytes, iovs)],
            open: 0,
            sending: false,
            reserve: (0, 0),
        }
    }

    /// Keeps room for `answers` answers (a header and a reference each)
    /// in the filling batch, which requests may not take
    /// ([`SendQueue::request_room`]).
    pub(crate) fn reserve_answers(&mut self, answers: usize, header: usize) {
        self.reserve = (answers * header, 2 * answers);
    }

    /// Whether a request of `bytes` staging bytes and up to two iovecs fits
    /// beside the room kept for answers.
    pub(crate) fn request_room(&self, bytes: usize) -> bool {
        let b = &self.batches[self.open];
        let (keep_bytes, keep_iovs) = self.reserve;
        b.iovs.len() + 2 + keep_iovs <= b.iovs.capacity()
            && b.used + bytes + keep_bytes <= b.buf.len()
    }

    /// Whether the room kept for answers is all free in the filling batch
    /// (with room for one more frame beside it).
    pub(crate) fn reserve_is_free(&self) -> bool {
        self.request_room(0)
    }

    /// Whether a batch queued or in flight sends bytes straight from a
    /// window of registration `key` ([`SendQueue::push_window`]).
    pub(crate) fn holds_window(&self, key: u32) -> bool {
        let sending = self.sending && self.batches[self.open ^ 1].windows.contains(&key);
        sending || self.batches[self.open].windows.contains(&key)
    }

    /// Whether a batch queued or in flight sends bytes straight from an
    /// operation's local memory ([`SendQueue::push_local`]).
    pub(crate) fn holds_local(&self) -> bool {
        (self.sending && self.batches[self.open ^ 1].locals) || self.batches[self.open].locals
    }

    fn open(&mut self) -> &mut Batch {
        &mut self.batches[self.open]
    }

    /// Staging bytes free in the filling batch.
    pub(crate) fn room(&self) -> usize {
        let b = &self.batches[self.open];
        if b.iovs.len() + 2 > b.iovs.capacity() {
            0
        } else {
            b.buf.len() - b.used
        }
    }

    /// Bytes waiting for the next send.
    pub(crate) fn queued(&self) -> usize {
        self.batches[self.open].total
    }

    /// Whether a send is in flight.
    pub(crate) fn is_sending(&self) -> bool {
        self.sending
    }

    /// Copies `parts` into the filling batch; `false` (nothing queued) if
    /// they do not fit.
    pub(crate) fn push_copy(&mut self, parts: &[&[u8]]) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.room() {
            return false;
        }
        let b = self.open();
        let start = b.used;
        for part in parts {
            b.buf[b.used..b.used + part.len()].copy_from_slice(part);
            b.used += part.len();
        }
        let base = b.buf[start..].as_mut_ptr();
        b.push_iov(base, len);
        true
    }

    /// Queues `header` then `len` bytes that `fill` writes into staging
    /// (it gets those `len` bytes); `false` (nothing queued) if they do not
    /// fit.
    pub(crate) fn push_filled(
        &mut self,
        header: &[u8],
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> bool {
        if header.len() + len > self.room() {
            return false;
        }
        let b = self.open();
        let start = b.used;
        b.buf[start..start + header.len()].copy_from_slice(header);
        fill(&mut b.buf[start + header.len()..start + header.len() + len]);
        b.used += header.len() + len;
        let base = b.buf[start..].as_mut_ptr();
        b.push_iov(base, header.len() + len);
        true
    }

    /// Queues `header`, then `len` bytes at `addr` sent from where they
    /// are (for the kernel to read when the batch is sent); `false`
    /// (nothing queued) if there is no room. The callers below say why the
    /// range stays readable until this batch's send has completed.
    fn push_ref(&mut self, header: &[u8], addr: u64, len: usize) -> bool {
        if header.len() > self.room() {
            return false;
        }
        self.push_copy(&[header]);
        self.open().push_iov(addr as usize as *mut u8, len);
        true
    }

    /// Queues `header`, then an operation's local memory sent from where
    /// it is (a large PUT's payload); `false` (nothing queued) if there is
    /// no room.
    ///
    /// The kernel reads it when the batch is sent, before the operation
    /// completes: its ACK answers bytes the target received; and when the
    /// lane's connection closes, its failed requests are reported (at the
    /// next `poll`) only after the socket was shut down (`close_conn`),
    /// from when a send copies nothing more (a send on a socket shut down
    /// for writing fails before it copies). A lane that lets go of a
    /// connection that goes on serving the peer (`release_conn`) reports
    /// its requests failed at the next `poll` too, so it does so only
    /// while no batch reads local memory ([`SendQueue::holds_local`]);
    /// otherwise the connection closes.
    pub(crate) fn push_local(&mut self, header: &[u8], local: &Local) -> bool {
        if !self.push_ref(header, local.addr(), local.len() as usize) {
            return false;
        }
        self.open().locals = true;
        true
    }

    /// Queues `header`, then `span` of a target's window sent from where it
    /// is (GET data); `false` (nothing queued) if there is no room.
    /// Recorded: [`SendQueue::holds_window`] says that registration `key`'s
    /// window must stay until the send completes, which deregistering it
    /// waits for (the driver's `quiesce`).
    pub(crate) fn push_window(&mut self, header: &[u8], span: Span, key: u32) -> bool {
        if !self.push_ref(header, span.addr(), span.len() as usize) {
            return false;
        }
        let windows = &mut self.open().windows;
        if !windows.contains(&key) {
            windows.push(key);
        }
        true
    }

    /// Starts sending the filled batch if nothing is in flight: returns
    /// its msghdr, valid until the send completes.
    pub(super) fn start(&mut self) -> Option<*const libc::msghdr> {
        if self.sending || self.batches[self.open].is_empty() {
            return None;
        }
        self.sending = true;
        let sending = self.open;
        self.open ^= 1;
        Some(self.batches[sending].prepare())
    }

    /// The in-flight send moved `n` bytes.
    pub(crate) fn sent(&mut self, n: usize) -> Sent {
        let b = &mut self.batches[self.open ^ 1];
        if b.advance(n) {
            b.clear();
            self.sending = false;
            Sent::Done
        } else {
            Sent::More
        }
    }

    /// The msghdr of what is left of the batch in flight (after
    /// [`Sent::More`]), valid until its send completes.
    pub(super) fn rest(&mut self) -> *const libc::msghdr {
        self.batches[self.open ^ 1].prepare()
    }

    /// Drops everything queued (the connection is closing).
    pub(crate) fn discard(&mut self) {
        self.batches[self.open].clear();
    }
}

/// The bytes a msghdr names, for tests.
#[cfg(test)]
fn read_all(msg: *const libc::msghdr) -> Vec<u8> {
    let mut out = Vec::new();
    // SAFETY: a msghdr this module prepared: its iovecs point at live
    // staging or at the test's own buffers.
    unsafe {
        let m = &*msg;
        for i in 0..m.msg_iovlen {
            let iov = &*m.msg_iov.add(i);
            out.extend_from_slice(std::slice::from_raw_parts(
                iov.iov_base as *const u8,
                iov.iov_len,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::mem::Window;
    use super::*;

    #[test]
    fn batches_alternate_and_keep_order() {
        let mut q = SendQueue::new(64, 8);
        let payload = *b"0123456789abcdef";
        assert!(q.push_copy(&[b"head", b"er"]));
        // `payload` outlives the sends below.
        assert!(q.push_ref(b"H2", payload.as_ptr() as u64, payload.len()));
        assert!(q.push_filled(b"H3", 3, |p| p.copy_from_slice(b"xyz")));
        let msg = q.start().unwrap();
        assert!(q.start().is_none(), "one send at a time");
        assert_eq!(read_all(msg), b"headerH20123456789abcdefH3xyz");
        assert!(q.push_copy(&[b"next"]));
        assert_eq!(q.queued(), 4);
        // A partial send: the rest is offered again.
        assert_eq!(q.sent(10), Sent::More);
        assert_eq!(read_all(q.rest()), b"23456789abcdefH3xyz");
        assert_eq!(q.sent(19), Sent::Done);
        assert_eq!(read_all(q.start().unwrap()), b"next");
    }

    #[test]
    fn requests_leave_the_room_kept_for_answers() {
        let mut q = SendQueue::new(1000, 16);
        q.reserve_answers(2, 100);
        // 200 bytes and 4 iovecs are kept: 800 bytes for requests.
        assert!(q.request_room(800));
        assert!(!q.request_room(801));
        assert!(q.push_copy(&[&[1u8; 700]]));
        assert!(!q.request_room(101));
        // Answers may take the kept room.
        assert!(q.push_copy(&[&[2u8; 300]]));
        assert_eq!(q.room(), 0);
        // Iovecs are kept too: 12 separate ones leave 4 of 16, fewer than
        // a request's 2 and the 4 kept.
        let mut q = SendQueue::new(1 << 20, 16);
        q.reserve_answers(2, 100);
        let data = [0u8; 4];
        for _ in 0..6 {
            // Nothing is sent.
            assert!(q.push_ref(b"h", data.as_ptr() as u64, 4));
        }
        assert!(!q.request_room(1));
        assert!(q.room() > 0);
    }

    #[test]
    fn window_references_are_counted_until_their_send_completes() {
        let mut q = SendQueue::new(1024, 8);
        let window = [9u8; 32];
        let base = window.as_ptr() as u64;
        // `window` outlives every send below.
        let span = Window::new(base, 32, 0).span(base, 32).unwrap();
        assert!(!q.holds_window(3));
        assert!(q.push_window(b"H", span, 3));
        assert!(q.holds_window(3));
        assert!(!q.holds_window(4), "another registration");
        let msg = q.start().unwrap();
        assert_eq!(read_all(msg).len(), 33);
        assert!(q.holds_window(3), "in flight");
        assert!(q.push_copy(&[b"x"]));
        assert_eq!(q.sent(33), Sent::Done);
        assert!(!q.holds_window(3));
        // A reference queued but not sent holds the window too.
        assert!(q.push_window(b"H", span, 3));
        assert!(q.holds_window(3));
    }

    #[test]
    fn local_references_are_seen_until_their_send_completes() {
        let mut q = SendQueue::new(1024, 8);
        let payload = [7u8; 32];
        // SAFETY: `payload` outlives every send below.
        let local = unsafe { Local::vouched(payload.as_ptr() as u64, 32) };
        assert!(q.push_copy(&[b"copied"]));
        assert!(!q.holds_local(), "copies read no local memory");
        assert!(q.push_local(b"H", &local));
        assert!(q.holds_local());
        let msg = q.start().unwrap();
        assert_eq!(read_all(msg).len(), 39);
        assert!(q.holds_local(), "in flight");
        assert!(q.push_copy(&[b"x"]));
        assert_eq!(q.sent(20), Sent::More);
        assert!(q.holds_local(), "partly sent");
        assert_eq!(q.sent(19), Sent::Done);
        assert!(!q.holds_local(), "the queued batch only copies");
        assert!(q.push_local(b"H", &local));
        q.discard();
        assert!(!q.holds_local(), "discarded");
    }

    #[test]
    fn a_full_batch_refuses_without_queueing() {
        let mut q = SendQueue::new(16, 8);
        assert!(q.push_copy(&[&[1u8; 10]]));
        assert!(!q.push_copy(&[&[2u8; 7]]));
        assert!(!q.push_filled(&[0; 4], 3, |_| panic!("not called")));
        assert_eq!(q.queued(), 10);
        assert_eq!(q.room(), 6);
        // Few iovecs left: no room either.
        let mut q = SendQueue::new(1024, 3);
        let data = [0u8; 4];
        // Nothing is sent.
        assert!(q.push_ref(b"h", data.as_ptr() as u64, 4));
        assert_eq!(q.room(), 0);
    }
}
