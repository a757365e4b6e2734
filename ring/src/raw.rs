//! The pointers that a producer and a consumer of one ring share, and the
//! heap-backed in-process ring.

use crate::consumer::Consumer;
use crate::entry::Entry;
use crate::layout::{ConsumerLine, MAX_ENTRIES, ProducerLine};
use crate::producer::Producer;
use crate::sync::Cells;
use core::any::Any;
use core::fmt;
use core::ptr::NonNull;
use std::sync::Arc;

/// One ring as seen by one side: where its two index lines and its slots
/// are, and a handle that keeps that memory alive.
pub(crate) struct RawRing<T> {
    /// The producer's line; valid while `owner` lives.
    producer: NonNull<ProducerLine>,
    /// The consumer's line; valid while `owner` lives.
    consumer: NonNull<ConsumerLine>,
    /// The slots; valid while `owner` lives.
    pub(crate) cells: Cells<T>,
    /// `capacity - 1`; capacity is a power of two.
    pub(crate) mask: u32,
    /// Owns the memory all the pointers above point into.
    owner: Arc<dyn Any + Send + Sync>,
}

impl<T> RawRing<T> {
    /// # Safety
    /// - `producer`, `consumer` and `cells` point into memory that `owner`
    ///   keeps mapped, aligned and valid, for as long as `owner` lives.
    /// - `capacity` is a power of two and `cells` has `capacity` slots.
    pub(crate) unsafe fn new(
        producer: NonNull<ProducerLine>,
        consumer: NonNull<ConsumerLine>,
        cells: Cells<T>,
        capacity: u32,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Self {
        debug_assert!(capacity.is_power_of_two());
        RawRing {
            producer,
            consumer,
            cells,
            mask: capacity - 1,
            owner,
        }
    }

    /// The producer's index line.
    #[inline]
    pub(crate) fn producer_line(&self) -> &ProducerLine {
        // SAFETY: `owner` keeps the line mapped and valid (`new`). Every
        // byte of it is an atomic (the index words and `Reserved`), so the
        // reference promises nothing about memory the other side writes
        // except what atomics allow; it is only ever accessed atomically.
        unsafe { self.producer.as_ref() }
    }

    /// The consumer's index line.
    #[inline]
    pub(crate) fn consumer_line(&self) -> &ConsumerLine {
        // SAFETY: as `producer_line`.
        unsafe { self.consumer.as_ref() }
    }

    #[inline]
    pub(crate) fn capacity(&self) -> u32 {
        self.mask + 1
    }

    /// Where this ring's shared words and slots are, with one side's local
    /// indices (`index`, `cached_peer`) filled in by the caller.
    #[cfg(not(loom))]
    pub(crate) fn raw_parts(&self, index: u32, cached_peer: u32) -> RawParts<T>
    where
        T: Copy,
    {
        let producer = self.producer_line();
        let consumer = self.consumer_line();
        RawParts {
            tail: NonNull::from(&producer.tail).cast(),
            producer_flags: NonNull::from(&producer.flags).cast(),
            head: NonNull::from(&consumer.head).cast(),
            consumer_flags: NonNull::from(&consumer.flags).cast(),
            entries: self.cells.as_ptr(),
            capacity: self.capacity(),
            index,
            cached_peer,
        }
    }
}

/// The memory of one ring as raw pointers, for code outside Rust that runs
/// one side of the ring protocol itself: the C ABI's inline helpers in
/// `ringfence.h`, which write SQEs and read CQEs in place as liburing does.
///
/// Taken from a [`Producer`] ([`as_raw_parts`](Producer::as_raw_parts)) or
/// a [`Consumer`] ([`as_raw_parts`](Consumer::as_raw_parts)); whoever uses
/// it takes that side over and must follow the protocol of [`Producer`]
/// and [`Consumer`] exactly (the orderings in the crate docs' table), and
/// must not use the Rust side it came from any more.
///
/// The four index words are `AtomicU32`s in shared memory (`u32` in layout);
/// access them only atomically. Every pointer stays valid while the
/// [`Producer`] or [`Consumer`] it came from (or anything else that keeps the
/// ring's memory, such as its [`Region`](crate::Region)) lives.
#[cfg(not(loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawParts<T> {
    /// [`ProducerLine`]'s `tail`: written by the producer (Release), read by
    /// the consumer (Acquire).
    pub tail: NonNull<u32>,
    /// [`ProducerLine`]'s flags ([`ProducerLine::OVERFLOW`]): written by the
    /// producer (Release), read by the consumer (Acquire).
    pub producer_flags: NonNull<u32>,
    /// [`ConsumerLine`]'s `head`: written by the consumer (Release), read by
    /// the producer (Acquire).
    pub head: NonNull<u32>,
    /// [`ConsumerLine`]'s flags ([`ConsumerLine::NEED_WAKEUP`]): written by
    /// the consumer (Relaxed, then a SeqCst fence), read by the producer
    /// (a SeqCst fence, then Relaxed).
    pub consumer_flags: NonNull<u32>,
    /// The first of `capacity` entries.
    pub entries: NonNull<T>,
    /// Number of entries; a power of two (the mask is `capacity - 1`).
    pub capacity: u32,
    /// The side's own free-running index: the producer's `tail` (next slot
    /// to fill) or the consumer's `head` (next slot to read).
    pub index: u32,
    /// The side's cached copy of the peer's index: the producer's cached
    /// head, or the consumer's cached tail.
    pub cached_peer: u32,
}

impl<T> Clone for RawRing<T> {
    fn clone(&self) -> Self {
        RawRing {
            producer: self.producer,
            consumer: self.consumer,
            cells: self.cells.clone(),
            mask: self.mask,
            owner: Arc::clone(&self.owner),
        }
    }
}

impl<T> fmt::Debug for RawRing<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawRing")
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

// SAFETY: the pointers refer to memory owned by `owner` (an `Arc` of a
// `Send + Sync` value), accessed through atomics or, for slots, by exactly
// one producer and one consumer under the index protocol. Moving the ring
// to another thread moves nothing that is tied to the current one.
unsafe impl<T: Send> Send for RawRing<T> {}

/// The memory of an in-process ring.
#[cfg(not(loom))]
struct HeapRing<T> {
    producer: ProducerLine,
    consumer: ConsumerLine,
    slots: Box<[core::cell::UnsafeCell<T>]>,
}

// SAFETY: the lines are atomics; the slots are only reached through the
// `RawRing` pointers, by one producer and one consumer under the index
// protocol (a slot is never accessed by both at once).
#[cfg(not(loom))]
unsafe impl<T: Send> Sync for HeapRing<T> {}

#[cfg(loom)]
struct HeapRing {
    producer: ProducerLine,
    consumer: ConsumerLine,
}

/// A ring of `capacity` entries on the heap, for use between threads of one
/// process, as a producer and a consumer.
///
/// Rings that another process must reach live in a
/// [`Region`](crate::Region) instead; the producer and consumer types are the
/// same.
///
/// # Panics
/// If `capacity` is not a power of two in `1..=MAX_ENTRIES` (a programmer
/// error: the capacity is a constant of the caller's design).
///
/// # Examples
/// ```
/// use ringfence_ring::{Cqe, channel};
/// let (mut tx, mut rx) = channel::<Cqe>(8);
/// tx.push(Cqe::new(1, 0, 0)).unwrap();
/// assert_eq!(tx.submit(), 1);
/// assert_eq!(rx.pop(), Ok(Some(Cqe::new(1, 0, 0))));
/// ```
pub fn channel<T: Entry>(capacity: u32) -> (Producer<T>, Consumer<T>) {
    assert!(
        capacity.is_power_of_two() && capacity <= MAX_ENTRIES,
        "ring capacity must be a power of two in 1..=65536, got {capacity}"
    );
    let raw = heap_ring::<T>(capacity);
    (Producer::new(raw.clone(), 0, 0), Consumer::new(raw, 0))
}

#[cfg(not(loom))]
fn heap_ring<T: Entry>(capacity: u32) -> RawRing<T> {
    let ring = Arc::new(HeapRing {
        producer: ProducerLine::new(),
        consumer: ConsumerLine::new(),
        slots: (0..capacity)
            .map(|_| core::cell::UnsafeCell::new(T::ZERO))
            .collect(),
    });
    let producer = NonNull::from(&ring.producer);
    let consumer = NonNull::from(&ring.consumer);
    // `UnsafeCell<T>` has the layout of `T`, and the pointer comes from the
    // whole slice, so it may reach every slot.
    let base = NonNull::new(ring.slots.as_ptr() as *mut T).expect("slice pointers are never null");
    // SAFETY: `base` points to `capacity` slots owned by `ring`, which the
    // returned `RawRing` keeps alive; the cells allow writes through shared
    // references (`UnsafeCell`).
    let cells = unsafe { Cells::from_raw(base, capacity) };
    // SAFETY: every pointer points into `ring`, kept alive as the owner;
    // `capacity` is a power of two (checked by `channel`).
    unsafe { RawRing::new(producer, consumer, cells, capacity, ring) }
}

#[cfg(loom)]
fn heap_ring<T: Entry>(capacity: u32) -> RawRing<T> {
    let ring = Arc::new(HeapRing {
        producer: ProducerLine::new(),
        consumer: ConsumerLine::new(),
    });
    let producer = NonNull::from(&ring.producer);
    let consumer = NonNull::from(&ring.consumer);
    // SAFETY: the lines live in `ring`, kept alive as the owner.
    unsafe {
        RawRing::new(
            producer,
            consumer,
            Cells::new(capacity, T::ZERO),
            capacity,
            ring,
        )
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{Cqe, RingError, Sqe};

    fn cqe(i: u64) -> Cqe {
        Cqe::new(i, i as i32, 0)
    }

    #[test]
    fn entries_are_invisible_until_submit() {
        let (mut tx, mut rx) = channel::<Cqe>(4);
        assert_eq!((tx.capacity(), rx.capacity()), (4, 4));
        tx.push(cqe(1)).unwrap();
        tx.push(cqe(2)).unwrap();
        assert_eq!(tx.pending(), 2);
        assert_eq!(rx.pop(), Ok(None));
        assert_eq!(rx.ready(), Ok(0));
        assert_eq!(tx.submit(), 2);
        assert_eq!(tx.submit(), 0, "nothing new to publish");
        assert_eq!(tx.pending(), 0);
        assert_eq!(rx.ready(), Ok(2));
        assert_eq!(rx.peek(), Ok(Some(cqe(1))));
        assert_eq!(rx.peek(), Ok(Some(cqe(1))), "peek leaves the entry");
        assert_eq!(rx.pop(), Ok(Some(cqe(1))));
        assert_eq!(rx.pop(), Ok(Some(cqe(2))));
        assert_eq!(rx.pop(), Ok(None));
    }

    #[test]
    fn full_ring_refuses_then_frees() {
        let (mut tx, mut rx) = channel::<Cqe>(2);
        tx.push(cqe(1)).unwrap();
        tx.push(cqe(2)).unwrap();
        assert_eq!(tx.push(cqe(3)), Err(RingError::Full));
        assert_eq!(tx.free(), Ok(0));
        tx.submit();
        assert_eq!(
            tx.push(cqe(3)),
            Err(RingError::Full),
            "published but not consumed"
        );
        assert_eq!(rx.pop(), Ok(Some(cqe(1))));
        assert_eq!(tx.free(), Ok(1));
        tx.push(cqe(3)).unwrap();
        tx.submit();
        assert_eq!(rx.pop(), Ok(Some(cqe(2))));
        assert_eq!(rx.pop(), Ok(Some(cqe(3))));
        assert_eq!(RingError::Full.status(), crate::Status::NoResource);
    }

    #[test]
    fn batches_are_partial_when_space_is_short_and_wrap_in_order() {
        let (mut tx, mut rx) = channel::<Cqe>(8);
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        let mut out = [Cqe::default(); 5];
        // Sizes that do not divide the capacity, so batches straddle the end.
        for round in 0..if cfg!(miri) { 20 } else { 2000 } {
            let want = 1 + round % 7;
            let batch: Vec<Cqe> = (next_in..next_in + want).map(cqe).collect();
            let n = tx.push_batch(&batch).unwrap();
            assert!(n as u64 <= want);
            next_in += n as u64;
            tx.submit();
            let got = rx.pop_batch(&mut out[..(round % 5) as usize + 1]).unwrap();
            for c in &out[..got] {
                assert_eq!(*c, cqe(next_out));
                next_out += 1;
            }
        }
        while let Some(c) = rx.pop().unwrap() {
            assert_eq!(c, cqe(next_out));
            next_out += 1;
        }
        assert_eq!(next_in, next_out);
        assert_eq!(rx.pop_batch(&mut out), Ok(0));
        assert_eq!(tx.push_batch(&[]), Ok(0));
    }

    #[test]
    fn next_entry_hands_out_zeroed_slots() {
        let (mut tx, mut rx) = channel::<Sqe>(2);
        *tx.next_entry().unwrap() = Sqe::flush(9).with_user_data(1);
        tx.submit();
        assert_eq!(rx.pop().unwrap().unwrap().endpoint, 9);
        *tx.next_entry().unwrap() = Sqe::flush(9).with_user_data(2);
        tx.submit();
        assert_eq!(rx.pop().unwrap().unwrap().user_data, 2);
        // The third slot reuses the first: it must come back zeroed.
        let slot = tx.next_entry().unwrap();
        assert_eq!(*slot, Sqe::default());
        slot.user_data = 3;
        tx.next_entry().unwrap();
        assert_eq!(tx.next_entry(), Err(RingError::Full));
        assert_eq!(tx.submit(), 2);
        assert_eq!(rx.pop().unwrap().unwrap(), Sqe::nop().with_user_data(3));
        assert_eq!(rx.pop().unwrap().unwrap(), Sqe::nop());
    }

    #[test]
    fn wait_protocol_flags() {
        let (mut tx, mut rx) = channel::<Cqe>(4);
        assert!(!tx.needs_wakeup());
        assert_eq!(rx.prepare_wait(), Ok(true), "empty: the consumer may sleep");
        assert!(tx.needs_wakeup());
        rx.finish_wait();
        assert!(!tx.needs_wakeup());
        tx.push(cqe(1)).unwrap();
        tx.submit();
        assert_eq!(
            rx.prepare_wait(),
            Ok(false),
            "entries arrived: do not sleep"
        );
        assert!(!tx.needs_wakeup(), "the flag is cleared again");
    }

    #[test]
    #[cfg_attr(miri, ignore = "eventfd")]
    fn wait_sleeps_until_submit_and_wake_rings() {
        let bell = std::sync::Arc::new(crate::Doorbell::new().unwrap());
        let (mut tx, mut rx) = channel::<Cqe>(4);
        // Nothing ready and nobody rings: the wait times out.
        assert!(!rx.wait(&bell, Some(std::time::Duration::ZERO)).unwrap());
        assert!(!tx.needs_wakeup(), "the flag is cleared after a wait");
        let consumer = {
            let bell = bell.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while got.len() < 3 {
                    match rx.pop().unwrap() {
                        Some(c) => got.push(c),
                        None => {
                            // No timeout: only the producer's ring ends this.
                            rx.wait(&bell, None).unwrap();
                        }
                    }
                }
                got
            })
        };
        for i in 0..3 {
            tx.push(cqe(i)).unwrap();
            assert_eq!(tx.submit_and_wake(&bell).unwrap(), 1);
        }
        assert_eq!(consumer.join().unwrap(), vec![cqe(0), cqe(1), cqe(2)]);
    }

    #[test]
    #[cfg_attr(miri, ignore = "eventfd")]
    fn a_stale_ring_does_not_end_a_wait_early() {
        let bell = std::sync::Arc::new(crate::Doorbell::new().unwrap());
        let (mut tx, mut rx) = channel::<Cqe>(4);
        // A ring for an entry the consumer took without sleeping, still on
        // the doorbell when the next wait starts.
        bell.ring().unwrap();
        let producer = {
            let bell = bell.clone();
            std::thread::spawn(move || {
                // Once the waiter has taken the stale ring (the doorbell is
                // clear again), the entry comes.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                let rung = |bell: &crate::Doorbell| {
                    use std::os::fd::AsFd;
                    let mut fds = [nix::poll::PollFd::new(
                        bell.as_fd(),
                        nix::poll::PollFlags::POLLIN,
                    )];
                    nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap() > 0
                };
                while rung(&bell) {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the waiter never woke"
                    );
                    std::thread::yield_now();
                }
                tx.push(cqe(7)).unwrap();
                tx.submit_and_wake(&bell).unwrap();
            })
        };
        // No timeout: only an entry ends this wait.
        assert!(rx.wait(&bell, None).unwrap());
        assert_eq!(rx.pop().unwrap(), Some(cqe(7)));
        producer.join().unwrap();
    }

    #[test]
    fn overflow_flag() {
        let (mut tx, rx) = channel::<Cqe>(4);
        assert!(!rx.is_overflowed());
        tx.set_overflow(true);
        assert!(rx.is_overflowed());
        tx.set_overflow(false);
        assert!(!rx.is_overflowed());
    }

    #[test]
    fn corrupt_indices_are_errors_and_change_nothing() {
        let (mut tx, mut rx) = channel::<Cqe>(4);
        tx.push(cqe(1)).unwrap();
        tx.submit();
        // A tail more than `capacity` ahead of the head.
        tx.ring.producer_line().tail.store(100, Ordering::Release);
        let bad = Corrupt {
            head: 0,
            tail: 100,
            capacity: 4,
        };
        assert_eq!(rx.pop(), Err(bad));
        assert_eq!(rx.pop_batch(&mut [Cqe::default(); 2]), Err(bad));
        assert_eq!(rx.ready(), Err(bad));
        assert_eq!(rx.prepare_wait(), Err(bad));
        assert!(
            !tx.needs_wakeup(),
            "a failed prepare_wait leaves no flag behind"
        );
        tx.ring.producer_line().tail.store(1, Ordering::Release);
        assert_eq!(rx.pop(), Ok(Some(cqe(1))), "nothing was consumed meanwhile");

        // A head ahead of the tail.
        for _ in 0..4 {
            let _ = tx.push(cqe(2));
        }
        rx.ring.consumer_line().head.store(7, Ordering::Release);
        let err = tx.push(cqe(3)).unwrap_err();
        assert_eq!(
            err,
            RingError::Corrupt(Corrupt {
                head: 7,
                tail: 5,
                capacity: 4
            })
        );
        assert_eq!(err.status(), crate::Status::RingCorrupt);
        assert!(err.to_string().contains("exceeds capacity 4"));
        assert!(tx.free().is_err());
    }

    #[test]
    fn a_failed_ring_is_corrupt_on_the_slow_paths_only() {
        // The producer gives up: what it published stays readable first.
        let (mut tx, mut rx) = channel::<Cqe>(4);
        tx.push(cqe(1)).unwrap();
        tx.set_overflow(true);
        tx.push(cqe(2)).unwrap(); // pushed, published by `fail`
        tx.fail();
        assert!(
            rx.peer_failed() && !rx.is_overflowed(),
            "FAILED, OVERFLOW cleared"
        );
        tx.set_overflow(true);
        assert!(rx.peer_failed(), "set_overflow keeps FAILED");
        assert_eq!(rx.pop(), Ok(Some(cqe(1))));
        assert_eq!(rx.pop(), Ok(Some(cqe(2))));
        let err = rx.pop().unwrap_err();
        assert!(err.marked_failed(), "{err}");
        assert!(err.to_string().contains("ring failed"));
        assert_eq!(rx.ready(), Err(err));
        assert_eq!(rx.ready_published(), Err(err));
        assert_eq!(rx.prepare_wait(), Err(err));

        // The consumer gives up: the producer sees it once it looks full,
        // not before (no shared access while its cache says there is room).
        let (mut tx, mut rx) = channel::<Cqe>(2);
        rx.fail();
        assert!(tx.peer_failed());
        rx.request_wakeup();
        rx.finish_wait();
        assert!(tx.peer_failed(), "the wait's stores keep FAILED");
        tx.push(cqe(1)).unwrap();
        tx.push(cqe(2)).unwrap();
        let err = tx.push(cqe(3)).unwrap_err();
        assert!(
            matches!(err, RingError::Corrupt(c) if c.marked_failed()),
            "{err}"
        );
        assert_eq!(err.status(), crate::Status::RingCorrupt);
        assert!(tx.free().is_err());
    }

    #[test]
    fn the_consumer_checks_the_head_only_it_writes() {
        let (mut tx, mut rx) = channel::<Cqe>(4);
        tx.push(cqe(1)).unwrap();
        tx.submit();
        assert_eq!(rx.pop(), Ok(Some(cqe(1))));
        assert_eq!(rx.check_shared_head(), Ok(()));
        rx.ring.consumer_line().head.store(77, Ordering::Release);
        let err = rx.check_shared_head().unwrap_err();
        assert_eq!(err.head, 77);
        assert!(!err.marked_failed());
    }

    #[test]
    fn producer_and_consumer_on_two_threads() {
        let n: u64 = if cfg!(miri) { 200 } else { 200_000 };
        let (mut tx, mut rx) = channel::<Cqe>(16);
        let producer = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                match tx.push(cqe(i)) {
                    Ok(()) => i += 1,
                    Err(RingError::Full) => {
                        tx.submit();
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("{e}"),
                }
                if i % 3 == 0 {
                    tx.submit();
                }
            }
            tx.submit();
        });
        let mut expect = 0;
        while expect < n {
            match rx.pop().unwrap() {
                Some(c) => {
                    assert_eq!(c, cqe(expect));
                    expect += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        producer.join().unwrap();
        assert_eq!(rx.pop(), Ok(None));
    }

    #[test]
    fn raw_parts_point_at_the_shared_words_and_slots() {
        let (mut tx, mut rx) = channel::<Cqe>(4);
        tx.push(cqe(7)).unwrap();
        tx.submit();
        let (p, c) = (tx.as_raw_parts(), rx.as_raw_parts());
        assert_eq!((p.capacity, p.index, p.cached_peer), (4, 1, 0));
        assert_eq!((c.capacity, c.index, c.cached_peer), (4, 0, 0));
        assert_eq!((p.tail, p.head, p.entries), (c.tail, c.head, c.entries));
        // SAFETY: the ring lives (`tx`, `rx`); the words are read
        // atomically, and slot 0 was published by `submit`.
        unsafe {
            assert_eq!(
                AtomicU32::from_ptr(p.tail.as_ptr()).load(Ordering::Acquire),
                1
            );
            assert_eq!(p.entries.as_ptr().read(), cqe(7));
        }
        assert_eq!(rx.pop(), Ok(Some(cqe(7))));
        // SAFETY: as above.
        let head = unsafe { AtomicU32::from_ptr(c.head.as_ptr()).load(Ordering::Acquire) };
        assert_eq!(head, 1);
        tx.set_overflow(true);
        // SAFETY: as above.
        let flags =
            unsafe { AtomicU32::from_ptr(c.producer_flags.as_ptr()).load(Ordering::Acquire) };
        assert_eq!(flags, crate::ProducerLine::OVERFLOW);
        assert_eq!(rx.prepare_wait(), Ok(true));
        // SAFETY: as above.
        let flags =
            unsafe { AtomicU32::from_ptr(p.consumer_flags.as_ptr()).load(Ordering::Relaxed) };
        assert_eq!(flags, crate::ConsumerLine::NEED_WAKEUP);
    }

    #[test]
    #[should_panic(expected = "ring capacity must be a power of two")]
    fn capacity_must_be_a_power_of_two() {
        let _ = channel::<Cqe>(12);
    }

    #[test]
    #[should_panic(expected = "ring capacity must be a power of two")]
    fn capacity_has_a_limit() {
        let _ = channel::<Cqe>(MAX_ENTRIES * 2);
    }

    #[test]
    fn debug_output_names_the_capacity() {
        let (tx, _rx) = channel::<Cqe>(4);
        assert!(format!("{tx:?}").contains("capacity: 4"));
    }

    use crate::error::Corrupt;
    use crate::sync::{AtomicU32, Ordering};
}
