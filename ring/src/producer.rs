//! The producer side of an SPSC ring.
//!
//! The algorithm is the classic Lamport single-producer single-consumer
//! queue with free-running `u32` indices and cached peer indices, as in
//! io_uring and rtrb:
//!
//! - The producer owns `tail`. It writes entries at `tail & mask` and makes
//!   them visible with one Release store of the new tail per batch
//!   ([`Producer::submit`]).
//! - It knows the consumer's `head` only through `cached_head`, reloaded with
//!   Acquire when the cached value says the ring is full. That load pairs with
//!   the consumer's Release store of `head`, so the consumer's reads of the
//!   freed slots happen before the producer overwrites them.
//! - The producer never trusts the shared copy of its own index; it trusts
//!   its local `tail`. The consumer's `head` comes from shared memory and is
//!   checked: `tail - head` must not exceed the capacity.
//! - When it reloads the head it also reads the consumer's flags: a
//!   consumer that gave the ring up ([`ConsumerLine::FAILED`]) frees no
//!   more slots, so the ring is reported [`Corrupt`] instead of full.

use crate::entry::Entry;
use crate::error::{Corrupt, RingError};
use crate::layout::ConsumerLine;
use crate::raw::RawRing;
use crate::sync::{Ordering, fence};

/// Writes entries into a ring and publishes them in batches.
///
/// Entries pushed with [`push`](Producer::push),
/// [`push_batch`](Producer::push_batch) or filled in place with
/// [`next_entry`](Producer::next_entry) stay invisible to the consumer until
/// [`submit`](Producer::submit), which publishes all of them with one store.
#[derive(Debug)]
pub struct Producer<T: Entry> {
    pub(crate) ring: RawRing<T>,
    /// Next slot to fill, free-running. Written only here; trusted.
    /// Invariant: `tail - cached_head <= capacity`.
    tail: u32,
    /// The tail last stored to shared memory; `tail - published` entries are
    /// written but not yet visible.
    published: u32,
    /// The consumer's head as last loaded. May be stale (behind the real
    /// head), which only under-reports free space.
    cached_head: u32,
}

impl<T: Entry> Producer<T> {
    /// A producer whose tail and cached head start at the given values
    /// (zero for a new ring; the shared values, validated, when attaching).
    pub(crate) fn new(ring: RawRing<T>, tail: u32, head: u32) -> Self {
        debug_assert!(tail.wrapping_sub(head) <= ring.capacity());
        Producer {
            ring,
            tail,
            published: tail,
            cached_head: head,
        }
    }

    /// Number of slots in the ring.
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.ring.capacity()
    }

    /// Entries pushed but not yet [`submit`](Producer::submit)ted.
    #[inline]
    pub fn pending(&self) -> u32 {
        self.tail.wrapping_sub(self.published)
    }

    /// Free slots by the cached head: a lower bound, no shared access.
    #[inline]
    fn free_cached(&self) -> u32 {
        self.capacity() - self.tail.wrapping_sub(self.cached_head)
    }

    /// Reloads the consumer's head and returns the free slot count.
    #[cold]
    fn refresh_head(&mut self) -> Result<u32, Corrupt> {
        let line = self.ring.consumer_line();
        // Acquire: observes the consumer's reads of every slot before `head`
        // as done; pairs with the Release store in `Consumer::release`.
        let head = line.head.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        // Acquire: pairs with the Release store in `Consumer::fail`. The
        // word shares the head's line: no extra miss.
        let failed = line.flags.load(Ordering::Acquire) & ConsumerLine::FAILED != 0;
        if used > self.capacity() || failed {
            return Err(Corrupt {
                head,
                tail: self.tail,
                capacity: self.capacity(),
            });
        }
        self.cached_head = head;
        Ok(self.capacity() - used)
    }

    /// Free slots now (reloads the consumer's head).
    ///
    /// # Staleness
    /// The consumer may free more slots right after this returns; the count
    /// is a lower bound.
    ///
    /// # Errors
    /// [`Corrupt`] if the shared head contradicts the local tail, or the
    /// consumer gave the ring up ([`ConsumerLine::FAILED`]).
    pub fn free(&mut self) -> Result<u32, Corrupt> {
        self.refresh_head()
    }

    /// At least `want` free slots, or as many as there are.
    #[inline]
    fn reserve(&mut self, want: u32) -> Result<u32, Corrupt> {
        let free = self.free_cached();
        if free >= want {
            Ok(free)
        } else {
            self.refresh_head()
        }
    }

    /// Copies `entry` into the next slot. Not visible until
    /// [`submit`](Producer::submit).
    ///
    /// # Errors
    /// [`RingError::Full`] if the consumer has not freed a slot;
    /// [`RingError::Corrupt`] if the shared head is inconsistent, or the
    /// ring looked full and the consumer gave it up
    /// ([`ConsumerLine::FAILED`]). Nothing is written in either case.
    #[inline]
    pub fn push(&mut self, entry: T) -> Result<(), RingError> {
        if self.reserve(1)? == 0 {
            return Err(RingError::Full);
        }
        // SAFETY: `tail & mask < capacity`, and the slot is free: at least
        // one slot is free by the check above, and the free slots start at
        // `tail` (the consumer only reads slots before `tail`).
        unsafe { self.ring.cells.write(self.tail & self.ring.mask, entry) };
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Copies as many of `entries` as fit, in order, and returns how many.
    /// Not visible until [`submit`](Producer::submit).
    ///
    /// # Errors
    /// [`Corrupt`] if the shared head is inconsistent; nothing is written.
    #[inline]
    pub fn push_batch(&mut self, entries: &[T]) -> Result<usize, Corrupt> {
        let want = u32::try_from(entries.len()).unwrap_or(u32::MAX);
        let n = self.reserve(want)?.min(want);
        for (i, entry) in entries[..n as usize].iter().enumerate() {
            let index = self.tail.wrapping_add(i as u32) & self.ring.mask;
            // SAFETY: `index < capacity`; slots `tail..tail + n` are free
            // because `n <= free` (as in `push`).
            unsafe { self.ring.cells.write(index, *entry) };
        }
        self.tail = self.tail.wrapping_add(n);
        Ok(n as usize)
    }

    /// The next free slot, zeroed, to fill in place (as liburing's
    /// `io_uring_get_sqe`). It counts as pushed: it is published by the next
    /// [`submit`](Producer::submit).
    ///
    /// # Errors
    /// As [`push`](Producer::push).
    ///
    /// # Examples
    /// ```
    /// use ringfence_ring::{Sqe, channel};
    /// let (mut sq, mut engine) = channel::<Sqe>(4);
    /// let sqe = sq.next_entry().unwrap();
    /// *sqe = Sqe::nop().with_user_data(11);
    /// sq.submit();
    /// assert_eq!(engine.pop().unwrap().unwrap().user_data, 11);
    /// ```
    #[cfg(not(loom))]
    #[inline]
    pub fn next_entry(&mut self) -> Result<&mut T, RingError> {
        if self.reserve(1)? == 0 {
            return Err(RingError::Full);
        }
        let index = self.tail & self.ring.mask;
        // SAFETY: the slot is in bounds and free (as in `push`); the
        // consumer cannot read it before the next `submit`, which needs
        // `&mut self`, so the returned borrow is the only access meanwhile.
        // A `&mut` into shared ring memory is sound here where it would not
        // be for a peer's memory: the slot belongs to this producer until
        // it publishes it, and the protocol gives no one else a reason to
        // write it (a consumer only reads published slots, before it
        // releases them). Only a corrupt consumer process could write it
        // meanwhile; what that could change is this entry's bytes, which
        // that consumer controls anyway once the entry is published, and
        // `T` is an `Entry` (plain integers, valid for every bit pattern),
        // so nothing in this process depends on them but the consumer.
        let slot = unsafe {
            let slot = self.ring.cells.slot_ptr(index);
            slot.write(T::ZERO);
            &mut *slot
        };
        self.tail = self.tail.wrapping_add(1);
        Ok(slot)
    }

    /// Publishes every pushed entry with one Release store; returns how many
    /// became visible.
    #[inline]
    pub fn submit(&mut self) -> u32 {
        let n = self.pending();
        if n != 0 {
            // Release: publishes the entries in [published, tail); pairs
            // with the Acquire load of `tail` in `Consumer::refresh_tail`.
            self.ring
                .producer_line()
                .tail
                .store(self.tail, Ordering::Release);
            self.published = self.tail;
        }
        n
    }

    /// Whether the consumer asked to be woken (it is asleep or about to be).
    /// Call it after [`submit`](Producer::submit); if it returns `true`, ring
    /// the consumer's [`Doorbell`](crate::Doorbell).
    ///
    /// # The SeqCst fence
    /// The consumer stores `NEED_WAKEUP`, then loads `tail`; the producer
    /// stores `tail`, then loads `NEED_WAKEUP`. That is the store-buffering
    /// (Dekker) pattern: with only acquire/release, both loads may miss the
    /// other side's store, the producer skips the wake-up and the consumer
    /// sleeps on a non-empty ring. A SeqCst fence between the store and the
    /// load on *both* sides (here and in
    /// [`Consumer::prepare_wait`](crate::Consumer::prepare_wait)) forbids
    /// that outcome: the fences are totally ordered, and whichever comes
    /// second sees the other side's store. This is the fence io_uring's
    /// SQPOLL mode needs around `IORING_SQ_NEED_WAKEUP` (liburing's
    /// `io_uring_smp_mb()` in `sq_ring_needs_enter`, the kernel's
    /// `smp_mb__after_atomic()` in `io_sqpoll_wait_sq`).
    #[inline]
    pub fn needs_wakeup(&self) -> bool {
        // SeqCst fence: orders the tail store above before the flag load;
        // pairs with the fence in `Consumer::prepare_wait` (see above).
        fence(Ordering::SeqCst);
        // Relaxed: the fence provides the ordering.
        self.ring.consumer_line().flags.load(Ordering::Relaxed) & ConsumerLine::NEED_WAKEUP != 0
    }

    /// Publishes pushed entries and rings `bell` if the consumer sleeps.
    ///
    /// # Errors
    /// The eventfd write failed (only if the descriptor is broken).
    #[cfg(not(loom))]
    pub fn submit_and_wake(&mut self, bell: &crate::Doorbell) -> std::io::Result<u32> {
        let n = self.submit();
        if self.needs_wakeup() {
            bell.ring()?;
        }
        Ok(n)
    }

    /// This ring's memory and this side's indices as raw pointers, for code
    /// that takes the producer side over (the C ABI); see
    /// [`RawParts`](crate::RawParts). Publish pending entries first: the
    /// parts carry the local tail, which includes them.
    ///
    /// # Examples
    /// ```
    /// use ringfence_ring::{Cqe, channel};
    /// let (tx, _rx) = channel::<Cqe>(8);
    /// let parts = tx.as_raw_parts();
    /// assert_eq!((parts.capacity, parts.index, parts.cached_peer), (8, 0, 0));
    /// ```
    #[cfg(not(loom))]
    pub fn as_raw_parts(&self) -> crate::RawParts<T> {
        self.ring.raw_parts(self.tail, self.cached_head)
    }

    /// Sets or clears the [`OVERFLOW`](crate::ProducerLine::OVERFLOW) flag
    /// (a CQ producer holds completions that did not fit). A
    /// [`FAILED`](crate::ProducerLine::FAILED) flag stays.
    #[inline]
    pub fn set_overflow(&mut self, overflow: bool) {
        let line = self.ring.producer_line();
        let flags = if overflow {
            crate::ProducerLine::OVERFLOW
        } else {
            0
        };
        // Relaxed: only this side writes the word.
        let failed = line.flags.load(Ordering::Relaxed) & crate::ProducerLine::FAILED;
        // Release: a consumer that sees the flag cleared also sees the
        // entries published before it; pairs with `Consumer::is_overflowed`.
        line.flags.store(flags | failed, Ordering::Release);
    }

    /// Gives the ring up: publishes what was pushed, then sets
    /// [`FAILED`](crate::ProducerLine::FAILED) (and clears
    /// [`OVERFLOW`](crate::ProducerLine::OVERFLOW)) in this side's flags.
    /// The consumer sees it once the ring is empty and reports the ring
    /// [`Corrupt`] from then on. For a producer that found the ring memory
    /// corrupt; it should publish nothing more.
    pub fn fail(&mut self) {
        self.submit();
        // Release: the entries published above are visible to a consumer
        // that sees the flag; pairs with the Acquire load in
        // `Consumer::refresh_tail`.
        self.ring
            .producer_line()
            .flags
            .store(crate::ProducerLine::FAILED, Ordering::Release);
    }

    /// Whether the consumer gave the ring up
    /// ([`ConsumerLine::FAILED`]).
    ///
    /// # Staleness
    /// The consumer may set it right after this returns.
    pub fn peer_failed(&self) -> bool {
        // Acquire: pairs with the Release store in `Consumer::fail`.
        self.ring.consumer_line().flags.load(Ordering::Acquire) & ConsumerLine::FAILED != 0
    }
}
