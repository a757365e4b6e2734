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
        // SAFETY: `owner` keeps the line mapped and valid (`new`), and it is
        // only ever accessed through atomics.
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
