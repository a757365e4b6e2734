//! Raw access to memory the driver does not own: an operation's local
//! memory ([`Local`], on the initiator) and the registered windows a
//! peer's requests reach ([`Window`], [`Span`], on the target). Every byte
//! moves through the engine's copy primitive for memory a peer or the
//! application may access concurrently ([`ringfence::peer_mem`]: an
//! aligned 1, 2, 4 or 8-byte word is one atomic access; no Rust reference
//! ever spans such memory).
//!
//! Each type here can only be made from what vouches for its memory, and
//! checks every offset against its own bounds before a byte moves.

use ringfence::{NotifyPool, Op, OpKind, peer_mem};
use ringfence_ring::{AtomicOp, Status};

/// The local memory of an operation handed to `Driver::post`: a PUT's
/// source, a GET's destination, a fetching atomic's result word, a
/// NOTIFY's payload.
///
/// Made only from the engine's promise ([`Local::vouched`]). Neither
/// `Copy` nor `Clone`: a lane keeps it with its request and drops it when
/// it reports the request's completion, so it never outlives the promise.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Local {
    addr: u64,
    len: u32,
}

impl Local {
    /// The local range `[addr, addr + len)` of an operation.
    ///
    /// # Safety
    /// The range is the local range of an operation passed to
    /// `Driver::post`, which the engine guarantees (the `post` contract)
    /// stays allocated, and registered or the caller's own, until the
    /// operation's completion is returned, or until a quiesce that covers
    /// it answers `Done`. The driver keeps the value no longer than that:
    /// a lane drops it when it reports the completion, and a teardown
    /// closes every connection (nothing reads or writes the range any
    /// more) before its quiesce answers `Done`.
    pub(crate) unsafe fn vouched(addr: u64, len: u32) -> Local {
        Local { addr, len }
    }

    /// The local memory of `op`: all but an atomic that does not fetch
    /// have some (`[op.local_addr, op.local_addr + op.len)`).
    ///
    /// # Safety
    /// `op` is an operation passed to `Driver::post`, and as
    /// [`Local::vouched`].
    pub(crate) unsafe fn of(op: &Op) -> Option<Local> {
        match op.kind {
            OpKind::Atomic(aop) if !aop.is_fetching() => None,
            // SAFETY: the caller's promise.
            _ => Some(unsafe { Local::vouched(op.local_addr, op.len) }),
        }
    }

    /// The length in bytes.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// Where it starts (for an iovec the kernel reads: `send`).
    pub(super) fn addr(&self) -> u64 {
        self.addr
    }

    /// Copies its first `dst.len()` bytes (at most all of it) into `dst`:
    /// a small PUT's or a NOTIFY's payload into staging.
    pub(crate) fn copy_to(&self, dst: &mut [u8]) {
        let len = dst.len().min(self.len as usize);
        // SAFETY: `[addr, addr + len)` lies inside the vouched range
        // (`Local::vouched`); `dst` is `len` writable bytes of our own.
        // Both are reached through raw pointers only.
        unsafe { peer_mem::copy(self.addr, dst.as_mut_ptr() as u64, len) }
    }

    /// Writes `bytes` at offset `at` (GET data); `false` (nothing written)
    /// if they would not fit inside.
    pub(crate) fn write(&self, at: u64, bytes: &[u8]) -> bool {
        let fits = at
            .checked_add(bytes.len() as u64)
            .is_some_and(|end| end <= u64::from(self.len));
        if fits {
            // SAFETY: `[addr + at, addr + at + bytes.len())` lies inside the
            // vouched range (checked just above); the source is a slice of
            // our own receive buffer.
            unsafe { peer_mem::copy(bytes.as_ptr() as u64, self.addr + at, bytes.len()) }
        }
        fits
    }

    /// Stores a fetching atomic's old value in its 8-byte result word;
    /// `false` (nothing stored) if the range is no aligned 8-byte word.
    pub(crate) fn store_u64(&self, value: u64) -> bool {
        let word = self.len >= 8 && self.addr.is_multiple_of(8);
        if word {
            // SAFETY: 8 aligned bytes inside the vouched range (checked
            // just above; the engine checked it too when validating the
            // operation).
            unsafe { peer_mem::store_u64(self.addr, value) };
        }
        word
    }
}

/// A local registration as the target checks it: the range a peer's
/// requests may reach, and the secret they must present.
///
/// Made from what the engine registers (`Driver::register`): registered
/// memory stays allocated until the driver's quiesce of its key answers
/// `Done` after its deregistration (the engine's contract), and the
/// driver answers `Pending` while a connection may still reach it
/// (`holds_key`, in `driver/teardown.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    base: u64,
    len: u64,
    secret: u64,
}

impl Window {
    /// The window of the registration `[base, base + len)` (`base + len`
    /// does not wrap: checked by the caller) with `secret`.
    pub(crate) fn new(base: u64, len: u64, secret: u64) -> Window {
        Window { base, len, secret }
    }

    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn secret(&self) -> u64 {
        self.secret
    }

    /// `[addr, addr + len)` if it lies inside the window.
    pub(crate) fn span(&self, addr: u64, len: u32) -> Option<Span> {
        let end = addr.checked_add(u64::from(len))?;
        if addr < self.base || end > self.base.saturating_add(self.len) {
            return None;
        }
        Some(Span { addr, len })
    }
}

/// A range inside a registered [`Window`], checked when a request's
/// header came: what a PUT writes, a GET reads, an ATOMIC updates.
///
/// Made only by [`Window::span`]. Its memory stays while the registration
/// lives, and after its deregistration while a connection still uses the
/// span: the driver's quiesce answers `Pending` while a PUT's payload is
/// still to be written into it (from the receive buffers or by a direct
/// receive) or GET data is sent from it (`holds_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    addr: u64,
    len: u32,
}

impl Span {
    /// Where it starts.
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    /// The length in bytes.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// The part from offset `at` to the end, if `at` is inside (or at the
    /// end).
    pub(crate) fn from(&self, at: u32) -> Option<Span> {
        let len = self.len.checked_sub(at)?;
        Some(Span {
            addr: self.addr + u64::from(at),
            len,
        })
    }

    /// Writes `bytes` at offset `at` (a PUT's payload, a piece at a time);
    /// `false` (nothing written) if they would not fit inside.
    pub(crate) fn write(&self, at: u32, bytes: &[u8]) -> bool {
        let fits = u64::from(at) + bytes.len() as u64 <= u64::from(self.len);
        if fits {
            // SAFETY: inside the span (checked just above), whose memory
            // stays (see the type's docs); the source is our own receive
            // buffer. The copy goes through raw pointers only: peers and
            // the application may access the window meanwhile.
            unsafe {
                peer_mem::copy(
                    bytes.as_ptr() as u64,
                    self.addr + u64::from(at),
                    bytes.len(),
                )
            }
        }
        fits
    }

    /// Copies `dst.len()` bytes from offset `at` into `dst` (GET data
    /// into staging); `false` (nothing copied) if they are not all inside.
    pub(crate) fn read(&self, at: u32, dst: &mut [u8]) -> bool {
        let fits = u64::from(at) + dst.len() as u64 <= u64::from(self.len);
        if fits {
            let src = (self.addr + u64::from(at)) as usize as *const u8;
            // SAFETY: inside the span (checked just above), whose memory
            // stays (see the type's docs); peers may write it meanwhile,
            // so it is read with the peer primitive (an aligned word is one
            // atomic load); `dst` is `dst.len()` bytes of our own staging.
            unsafe { peer_mem::copy_from_peer(src, dst.as_mut_ptr(), dst.len()) }
        }
        fits
    }

    /// Performs `op` on the span's 8-byte word; returns the old value.
    ///
    /// # Errors
    /// [`Status::InvalidLength`] if the span is not 8 bytes,
    /// [`Status::Misaligned`] if it is not 8-byte aligned.
    pub(crate) fn atomic(&self, op: AtomicOp, operand: u64, operand2: u64) -> Result<u64, Status> {
        if self.len != 8 {
            return Err(Status::InvalidLength);
        }
        if !self.addr.is_multiple_of(8) {
            return Err(Status::Misaligned);
        }
        // SAFETY: 8 aligned bytes (checked just above) of a span, whose
        // memory stays (see the type's docs); other accesses to the word
        // are atomic by the registration's contract.
        Ok(unsafe { peer_mem::atomic(self.addr, op, operand, operand2) })
    }
}

/// Hands an assembled notification payload to `pool` (tagged `tag`).
///
/// # Errors
/// As [`NotifyPool::deliver`]: too long, or no free buffer.
pub(crate) fn deliver(pool: &NotifyPool, payload: &[u8], tag: u64) -> Result<(), Status> {
    let len = u32::try_from(payload.len()).map_err(|_| Status::InvalidLength)?;
    // SAFETY: `payload` is `len` readable bytes of our own (the
    // connection's assembly buffer), borrowed for the whole call.
    unsafe { pool.deliver(payload.as_ptr() as u64, len, tag) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_lie_inside_their_window() {
        let w = Window::new(4096, 100, 7);
        assert_eq!(w.span(4096, 100).map(|s| s.len()), Some(100));
        assert!(w.span(4095, 1).is_none());
        assert!(w.span(4100, 97).is_none());
        assert!(w.span(u64::MAX, 2).is_none(), "wraps");
        let s = w.span(4100, 10).unwrap();
        assert_eq!(s.from(4).map(|r| (r.addr(), r.len())), Some((4104, 6)));
        assert_eq!(s.from(10).map(|r| r.len()), Some(0));
        assert!(s.from(11).is_none());
    }

    #[test]
    fn copies_stay_inside_their_range() {
        let mut buf = [0u8; 16];
        let base = buf.as_mut_ptr() as u64;
        let w = Window::new(base, 16, 0);
        let s = w.span(base + 4, 8).unwrap();
        assert!(s.write(2, b"abc"));
        assert!(!s.write(6, b"abc"), "past the end");
        let mut out = [0u8; 3];
        assert!(s.read(2, &mut out));
        assert_eq!(&out, b"abc");
        assert!(!s.read(7, &mut out));
        // SAFETY: `buf` outlives `local`, which only this test uses.
        let local = unsafe { Local::vouched(base, 16) };
        assert!(local.write(13, b"xyz"));
        assert!(!local.write(14, b"xyz"));
        let mut all = [0u8; 16];
        local.copy_to(&mut all);
        assert_eq!(&all[6..9], b"abc");
        assert_eq!(&all[13..], b"xyz");
        assert_eq!(buf[6..9], *b"abc");
    }
}
