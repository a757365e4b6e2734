//! The notification channel: a single-producer single-consumer byte ring in
//! the connection page, written by the initiator (NOTIFY) and drained by
//! the target's `poll`, which copies each payload once into one of its
//! notification buffers.
//!
//! The algorithm is the classic bounded SPSC ring with free-running
//! indices (as in the `ring` crate and io_uring): the producer owns `tail`,
//! the consumer owns `head`, each keeps its own index locally and reads the
//! other's only when its cached copy says full (producer) or empty
//! (consumer); one Release store publishes, one Acquire load observes.
//! Records are variable-length, 16-byte aligned, and never wrap: a pad
//! record fills the end of the ring when the next record does not fit
//! there.
//!
//! The consumer treats everything in the page as untrusted: `tail - head`
//! above the capacity or not a multiple of 16, an unknown record kind, or a
//! record that would cross the end of the ring or the published bytes marks
//! the channel broken (nothing more is read from it) instead of being
//! followed.

use crate::layout::{
    CHANNEL_AT, CONN_MAGIC, CONN_VERSION, HEAD_AT, KIND_NOTIFY, KIND_PAD, NEED_WAKEUP,
    RECORD_ALIGN, TAIL_AT, WAKE_AT,
};
use crate::sys::region::SharedRegion;
use crate::sys::rma;
use ringfence::{NotifyPool, Op};
use ringfence_ring::Status;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

/// Records delivered from one channel per `poll`.
pub(crate) const DRAIN_BUDGET: usize = 64;

fn record_len(payload: u32) -> u64 {
    RECORD_ALIGN + u64::from(payload).next_multiple_of(RECORD_ALIGN)
}

fn header(len: u32, kind: u32, tag: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&len.to_le_bytes());
    h[4..8].copy_from_slice(&kind.to_le_bytes());
    h[8..].copy_from_slice(&tag.to_le_bytes());
    h
}

/// Where drained notifications go: the worker's [`NotifyPool`] (tests use
/// their own sink).
pub(crate) trait Deliver {
    /// Copies the payload at `[offset, offset + len)` of `page` once into a
    /// buffer of the target.
    ///
    /// # Errors
    /// [`Status::NoResource`] when no buffer is free (retry later); any
    /// other status drops the record.
    fn deliver(&self, page: &SharedRegion, offset: u64, len: u32, tag: u64) -> Result<(), Status>;
}

impl Deliver for NotifyPool {
    fn deliver(&self, page: &SharedRegion, offset: u64, len: u32, tag: u64) -> Result<(), Status> {
        rma::deliver(self, page, offset, len, tag)
    }
}

/// The shared indices are inconsistent: the peer wrote garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Corrupt;

/// Writes the header of a new connection page (before it is shared).
pub(crate) fn init_page(page: &SharedRegion, capacity: u32) -> bool {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(&CONN_MAGIC.to_le_bytes());
    h[8..12].copy_from_slice(&CONN_VERSION.to_le_bytes());
    h[12..].copy_from_slice(&capacity.to_le_bytes());
    page.write(0, &h)
}

/// Checks the header of a connection page from a peer.
pub(crate) fn check_page(page: &SharedRegion, capacity: u32) -> bool {
    let mut h = [0u8; 16];
    page.read(0, &mut h)
        && h[..8] == CONN_MAGIC.to_le_bytes()
        && h[8..12] == CONN_VERSION.to_le_bytes()
        && h[12..] == capacity.to_le_bytes()
}

/// The initiator's end.
#[derive(Debug)]
pub(crate) struct Producer {
    page: SharedRegion,
    capacity: u64,
    /// Bytes published; only this side writes it.
    tail: u64,
    /// The consumer's `head` as last read; may be stale (behind), never
    /// ahead.
    cached_head: u64,
}

impl Producer {
    /// The producer of a fresh page (indices zero) of `capacity` bytes.
    pub(crate) fn new(page: SharedRegion, capacity: u32) -> Producer {
        Producer {
            page,
            capacity: u64::from(capacity),
            tail: 0,
            cached_head: 0,
        }
    }

    /// The connection page.
    pub(crate) fn page(&self) -> &SharedRegion {
        &self.page
    }

    /// Whether a payload of `len` bytes can ever fit.
    pub(crate) fn fits(&self, len: u32) -> bool {
        record_len(len) <= self.capacity
    }

    fn free(&self) -> u64 {
        self.capacity - self.tail.wrapping_sub(self.cached_head)
    }

    /// Appends a NOTIFY record with `op`'s payload and tag and publishes it.
    /// Returns `Ok(false)` (nothing written) when there is no room yet.
    ///
    /// # Errors
    /// [`Corrupt`] if the consumer's index is inconsistent.
    pub(crate) fn push(&mut self, op: &Op) -> Result<bool, Corrupt> {
        let rec = record_len(op.len);
        if rec > self.capacity {
            return Ok(false);
        }
        let pos = self.tail % self.capacity;
        let contiguous = self.capacity - pos;
        let need = if rec <= contiguous {
            rec
        } else {
            contiguous + rec
        };
        if self.free() < need {
            let word = self.page.word(HEAD_AT).ok_or(Corrupt)?;
            // Acquire: the consumer's reads of the bytes it released are
            // done; pairs with the Release in `drain`.
            let head = word.load(Ordering::Acquire);
            let used = self.tail.wrapping_sub(head);
            if used > self.capacity || head % RECORD_ALIGN != 0 {
                return Err(Corrupt);
            }
            self.cached_head = head;
            if self.free() < need {
                return Ok(false);
            }
        }
        let mut at = CHANNEL_AT as u64 + pos;
        if rec > contiguous {
            // Fill the end; the record goes to the start.
            let pad = header((contiguous - RECORD_ALIGN) as u32, KIND_PAD, 0);
            if !self.page.write(at, &pad) {
                return Err(Corrupt);
            }
            self.tail = self.tail.wrapping_add(contiguous);
            at = CHANNEL_AT as u64;
        }
        if !self
            .page
            .write(at, &header(op.len, KIND_NOTIFY, op.operand))
            || !rma::copy_payload(&self.page, at + RECORD_ALIGN, op)
        {
            return Err(Corrupt);
        }
        self.tail = self.tail.wrapping_add(rec);
        let word = self.page.word(TAIL_AT).ok_or(Corrupt)?;
        // Release: publishes the record, and every copy this process made
        // into the target's memory before it; pairs with the Acquire in
        // `drain`.
        word.store(self.tail, Ordering::Release);
        Ok(true)
    }

    /// Whether the target asked to be woken (its worker is not polling):
    /// call after `push` published, and ring the target's doorbell if so.
    pub(crate) fn needs_wakeup(&self) -> bool {
        // SeqCst fence: the tail store above before the `wake` load; pairs
        // with the fence in `Inbound::arm` (store-buffering: one of the two
        // sides sees the other's store).
        fence(Ordering::SeqCst);
        self.page
            .word(WAKE_AT)
            .is_some_and(|w| w.load(Ordering::Relaxed) & NEED_WAKEUP != 0)
    }
}

/// The target's end of one incoming connection.
#[derive(Debug)]
pub(crate) struct Inbound {
    page: SharedRegion,
    capacity: u64,
    /// Bytes consumed. Written only by the driver's `poll` (one thread at a
    /// time, under the engine lock); atomic only because the control thread
    /// shares this struct.
    head: AtomicU64,
    /// Set by the control thread when the peer hung up: nothing more will
    /// be published, so once drained the channel is finished.
    pub closing: AtomicBool,
    /// Set by `poll`: drained after `closing`, or broken. The control
    /// thread then drops the channel.
    pub done: AtomicBool,
    /// Set by `poll`: the peer wrote garbage; nothing more is read.
    pub broken: AtomicBool,
    /// Held by whoever drains (the driver's `poll` or the control thread),
    /// so that the channel has one consumer at a time.
    draining: AtomicBool,
    /// The peer process, for logs.
    pub peer_pid: i32,
}

/// What one drain did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Drained {
    /// Notifications handed to the pool.
    pub delivered: usize,
    /// Records dropped because they did not fit the target's buffers.
    pub dropped: usize,
}

impl Inbound {
    /// The consumer of a fresh page from a peer (its header checked).
    pub(crate) fn new(page: SharedRegion, capacity: u32, peer_pid: i32) -> Inbound {
        Inbound {
            page,
            capacity: u64::from(capacity),
            head: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            done: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            peer_pid,
        }
    }

    /// The connection page.
    pub(crate) fn page(&self) -> &SharedRegion {
        &self.page
    }

    /// Asks producers to ring the doorbell after they publish (the
    /// target's worker stopped polling); returns whether records are
    /// waiting already (the caller drains them: no ring will come for
    /// those).
    pub(crate) fn arm(&self) -> bool {
        let Some(wake) = self.page.word(WAKE_AT) else {
            return false;
        };
        if wake.load(Ordering::Relaxed) & NEED_WAKEUP == 0 {
            wake.store(NEED_WAKEUP, Ordering::Relaxed);
        }
        // SeqCst fence: the `wake` store before the tail load; pairs with
        // the fence in `Producer::needs_wakeup`.
        fence(Ordering::SeqCst);
        self.has_pending()
    }

    /// Producers need not ring any more (the worker polls again).
    pub(crate) fn disarm(&self) {
        if let Some(wake) = self.page.word(WAKE_AT)
            && wake.load(Ordering::Relaxed) != 0
        {
            wake.store(0, Ordering::Relaxed);
        }
    }

    /// Whether published records wait to be drained.
    pub(crate) fn has_pending(&self) -> bool {
        self.page
            .word(TAIL_AT)
            .is_some_and(|t| t.load(Ordering::Acquire) != self.head.load(Ordering::Relaxed))
    }

    /// Delivers up to `budget` notifications into `pool`. A notification
    /// that finds no free buffer stays at the head, for a later call. If
    /// another thread is draining this channel, does nothing.
    ///
    /// # Errors
    /// [`Corrupt`]: the channel is now broken.
    pub(crate) fn drain(&self, pool: &impl Deliver, budget: usize) -> Result<Drained, Corrupt> {
        let mut out = Drained::default();
        if self.broken.load(Ordering::Relaxed) || self.done.load(Ordering::Relaxed) {
            return Ok(out);
        }
        // Nothing published since the last drain, the common case of a
        // poll: no claim of the channel (a locked instruction on a line the
        // control thread shares). A record published after this look is
        // drained by the next poll, as one published after a drain is. A
        // channel whose peer hung up takes the claim, so that draining it
        // empty finishes it.
        if !self.closing.load(Ordering::Relaxed) && self.looks_empty() {
            return Ok(out);
        }
        // Acquire: the previous drainer's updates of `head` are visible;
        // pairs with the Release below.
        if self
            .draining
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Ok(out);
        }
        let result = self.drain_locked(pool, budget, &mut out);
        self.draining.store(false, Ordering::Release);
        result.map(|()| out)
    }

    /// Whether the peer has published nothing beyond what was consumed
    /// (Acquire on the tail, as a drain reads it). A tail that cannot be
    /// read is not empty: the drain finds it corrupt.
    fn looks_empty(&self) -> bool {
        self.page
            .word(TAIL_AT)
            .is_some_and(|tail| tail.load(Ordering::Acquire) == self.head.load(Ordering::Relaxed))
    }

    fn drain_locked(
        &self,
        pool: &impl Deliver,
        budget: usize,
        out: &mut Drained,
    ) -> Result<(), Corrupt> {
        // Read before the tail: if the peer hung up, the tail read below is
        // final. Acquire pairs with the control thread's Release.
        let closing = self.closing.load(Ordering::Acquire);
        let result = self.drain_inner(pool, budget, out);
        match result {
            Err(Corrupt) => {
                tracing::error!(
                    peer = self.peer_pid,
                    "notification channel corrupt; nothing more is read from it"
                );
                self.broken.store(true, Ordering::Relaxed);
                self.done.store(true, Ordering::Release);
            }
            Ok(empty) if closing && empty => self.done.store(true, Ordering::Release),
            Ok(_) => {}
        }
        result.map(|_| ())
    }

    /// Returns whether the channel is empty afterwards.
    fn drain_inner(
        &self,
        pool: &impl Deliver,
        budget: usize,
        out: &mut Drained,
    ) -> Result<bool, Corrupt> {
        let start = self.head.load(Ordering::Relaxed);
        let mut head = start;
        // Acquire: the records in [head, tail) (and the data copied before
        // them) are visible; pairs with the Release in `Producer::push`.
        let tail = self
            .page
            .word(TAIL_AT)
            .ok_or(Corrupt)?
            .load(Ordering::Acquire);
        let mut avail = tail.wrapping_sub(head);
        if avail > self.capacity || avail % RECORD_ALIGN != 0 {
            return Err(Corrupt);
        }
        let mut handled = 0;
        while avail > 0 && handled < budget {
            let pos = head % self.capacity;
            let at = CHANNEL_AT as u64 + pos;
            let mut h = [0u8; 16];
            if !self.page.read(at, &mut h) {
                return Err(Corrupt);
            }
            let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let kind = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            let tag = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
            let total = match kind {
                KIND_PAD => {
                    let total = RECORD_ALIGN + u64::from(len);
                    if total != self.capacity - pos || total > avail {
                        return Err(Corrupt);
                    }
                    total
                }
                KIND_NOTIFY => {
                    let total = record_len(len);
                    if total > self.capacity - pos || total > avail {
                        return Err(Corrupt);
                    }
                    match pool.deliver(&self.page, at + RECORD_ALIGN, len, tag) {
                        Ok(()) => out.delivered += 1,
                        // No free buffer: stays at the head for later.
                        Err(Status::NoResource) => break,
                        Err(status) => {
                            // Larger than the target's buffers: the sender
                            // checks that, so only a misbehaving peer gets
                            // here. The record is consumed and counted.
                            tracing::warn!(peer = self.peer_pid, len, %status, "notification dropped");
                            out.dropped += 1;
                        }
                    }
                    handled += 1;
                    total
                }
                _ => return Err(Corrupt),
            };
            head = head.wrapping_add(total);
            avail -= total;
        }
        if head != start {
            self.head.store(head, Ordering::Relaxed);
            // Release: our reads of the consumed records are done before
            // the producer reuses the bytes; pairs with the Acquire in
            // `Producer::push`.
            self.page
                .word(HEAD_AT)
                .ok_or(Corrupt)?
                .store(head, Ordering::Release);
        }
        Ok(avail == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memfd;
    use ringfence::OpKind;
    use std::os::fd::AsFd;

    fn pair(capacity: u32) -> (Producer, Inbound, SharedRegion) {
        let size = CHANNEL_AT as u64 + u64::from(capacity);
        let fd = memfd::create("channel-test", size).unwrap();
        let a = SharedRegion::map(fd.as_fd(), 0, size as usize, true).unwrap();
        assert!(init_page(&a, capacity));
        let b = SharedRegion::map(fd.as_fd(), 0, size as usize, true).unwrap();
        assert!(check_page(&b, capacity));
        assert!(!check_page(&b, capacity * 2));
        let vandal = SharedRegion::map(fd.as_fd(), 0, size as usize, true).unwrap();
        (
            Producer::new(a, capacity),
            Inbound::new(b, capacity, 0),
            vandal,
        )
    }

    fn notify(payload: &[u8], tag: u64) -> Op {
        Op {
            kind: OpKind::Notify,
            lane: 0,
            local_addr: payload.as_ptr() as usize as u64,
            local_key: None,
            remote: None,
            len: payload.len() as u32,
            operand: tag,
            operand2: 0,
            fence: false,
        }
    }

    /// A sink with `buffers` slots of at most `size` bytes.
    struct Sink {
        buffers: usize,
        size: u32,
        got: std::cell::RefCell<Vec<(u64, Vec<u8>)>>,
    }

    impl Sink {
        fn new(buffers: usize, size: u32) -> Sink {
            Sink {
                buffers,
                size,
                got: Default::default(),
            }
        }
    }

    impl Deliver for Sink {
        fn deliver(
            &self,
            page: &SharedRegion,
            offset: u64,
            len: u32,
            tag: u64,
        ) -> Result<(), Status> {
            if len > self.size {
                return Err(Status::Truncated);
            }
            let mut got = self.got.borrow_mut();
            if got.len() >= self.buffers {
                return Err(Status::NoResource);
            }
            let mut payload = vec![0u8; len as usize];
            assert!(page.read(offset, &mut payload));
            got.push((tag, payload));
            Ok(())
        }
    }

    fn take_all(pool: &Sink) -> Vec<(u64, Vec<u8>)> {
        std::mem::take(&mut *pool.got.borrow_mut())
    }

    #[test]
    fn records_wrap_with_padding_and_arrive_in_order() {
        let (mut p, c, _) = pair(4096);
        let pool = Sink::new(4, 1024);
        let mut expect = Vec::new();
        for round in 0..40u64 {
            let tag = round;
            let len = 100 + (round as usize) * 37 % 900;
            let payload: Vec<u8> = (0..len).map(|i| (i as u64 + round) as u8).collect();
            while !p.push(&notify(&payload, tag)).unwrap() {
                let d = c.drain(&pool, DRAIN_BUDGET).unwrap();
                for got in take_all(&pool) {
                    assert_eq!(Some(&got), expect.first());
                    expect.remove(0);
                }
                assert!(d.delivered > 0 || !expect.is_empty());
            }
            expect.push((tag, payload));
        }
        while !expect.is_empty() {
            c.drain(&pool, DRAIN_BUDGET).unwrap();
            for got in take_all(&pool) {
                assert_eq!(got, expect.remove(0));
            }
        }
        assert!(p.tail > 4096, "wrapped at least once");
    }

    #[test]
    fn full_pool_keeps_the_record_and_garbage_breaks_the_channel() {
        let (mut p, c, vandal) = pair(4096);
        let pool = Sink::new(1, 64);
        assert!(p.push(&notify(b"one", 1)).unwrap());
        assert!(p.push(&notify(b"two", 2)).unwrap());
        assert_eq!(c.drain(&pool, DRAIN_BUDGET).unwrap().delivered, 1);
        assert_eq!(
            c.drain(&pool, DRAIN_BUDGET).unwrap().delivered,
            0,
            "no free buffer"
        );
        assert_eq!(take_all(&pool), vec![(1, b"one".to_vec())]);
        assert_eq!(c.drain(&pool, DRAIN_BUDGET).unwrap().delivered, 1);
        assert_eq!(take_all(&pool), vec![(2, b"two".to_vec())]);
        assert!(!p.fits(8192));
        assert!(!p.push(&notify(&[0u8; 5000], 3)).unwrap(), "never fits");

        // A tail far ahead of the head.
        vandal
            .word(TAIL_AT)
            .unwrap()
            .store(1 << 40, Ordering::SeqCst);
        assert_eq!(c.drain(&pool, DRAIN_BUDGET), Err(Corrupt));
        assert!(c.broken.load(Ordering::SeqCst) && c.done.load(Ordering::SeqCst));
        assert_eq!(
            c.drain(&pool, DRAIN_BUDGET),
            Ok(Drained::default()),
            "stays broken"
        );
        // A head behind the tail by more than the capacity.
        vandal
            .word(HEAD_AT)
            .unwrap()
            .store(u64::MAX - 64, Ordering::SeqCst);
        p.cached_head = 0;
        p.tail = 4090 / 16 * 16;
        assert_eq!(p.push(&notify(&[1u8; 200], 4)), Err(Corrupt));
    }

    #[test]
    fn arming_asks_producers_to_ring() {
        let (mut p, c, _) = pair(4096);
        let pool = Sink::new(8, 64);
        assert!(!p.needs_wakeup());
        assert!(!c.arm(), "nothing pending");
        assert!(p.push(&notify(b"x", 1)).unwrap());
        assert!(p.needs_wakeup());
        assert!(c.has_pending() && c.arm(), "pending at arm time");
        c.disarm();
        assert!(!p.needs_wakeup());
        assert_eq!(c.drain(&pool, DRAIN_BUDGET).unwrap().delivered, 1);
        assert!(!c.has_pending());
        // One consumer at a time.
        assert!(p.push(&notify(b"y", 2)).unwrap());
        c.draining.store(true, Ordering::SeqCst);
        assert_eq!(c.drain(&pool, DRAIN_BUDGET).unwrap().delivered, 0);
        c.draining.store(false, Ordering::SeqCst);
        assert_eq!(c.drain(&pool, DRAIN_BUDGET).unwrap().delivered, 1);
    }

    #[test]
    fn oversized_records_are_dropped_and_counted() {
        let (mut p, c, _) = pair(4096);
        let pool = Sink::new(8, 4);
        assert!(p.push(&notify(b"too long", 1)).unwrap());
        assert!(p.push(&notify(b"ok", 2)).unwrap());
        let d = c.drain(&pool, DRAIN_BUDGET).unwrap();
        assert_eq!((d.delivered, d.dropped), (1, 1));
        assert_eq!(take_all(&pool), vec![(2, b"ok".to_vec())]);
    }

    #[test]
    fn bad_records_are_refused() {
        for bad in [
            header(5000, KIND_NOTIFY, 0), // crosses the end
            header(0, 77, 0),             // unknown kind
            header(10, KIND_PAD, 0),      // pad that does not reach the end
        ] {
            let (_, c, vandal) = pair(4096);
            let pool = Sink::new(1, 8192);
            assert!(vandal.write(CHANNEL_AT as u64, &bad));
            vandal.word(TAIL_AT).unwrap().store(16, Ordering::SeqCst);
            assert_eq!(c.drain(&pool, DRAIN_BUDGET), Err(Corrupt), "{bad:?}");
        }
        let (_, c, vandal) = pair(4096);
        vandal.word(TAIL_AT).unwrap().store(8, Ordering::SeqCst);
        let pool = Sink::new(1, 64);
        assert_eq!(c.drain(&pool, DRAIN_BUDGET), Err(Corrupt), "unaligned tail");
    }
}
