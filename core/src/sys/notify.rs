//! Notification buffers: where incoming NOTIFY payloads land on the target.
//!
//! The target provides `count` buffers of `size` bytes when it builds its
//! worker. A driver that receives a notification claims a free buffer,
//! copies the payload into it once, and queues a delivery; the target's
//! progress loop turns each delivery into a CQE (flag `NOTIFICATION`, buffer
//! id in the upper 16 bits of `flags`, `res` = length, `user_data` = the
//! sender's tag). The application reads the payload through
//! [`QueuePair::notification`](crate::QueuePair::notification), which gives
//! the buffer back when dropped.
//!
//! Buffer states (one atomic byte each): `FREE` → (driver) `FILLING` →
//! `FULL` → (application) `READING` → `FREE`. Only the owner of a state moves
//! it on, so a buffer is never written while read.
//!
//! # A full pool
//! A claim that finds every buffer taken fails with
//! [`Status::NoResource`] and leaves a mark (`wanted`); the release that
//! next frees a buffer sees it, clears it and rings the waker (the
//! worker's SQ doorbell) once, so a driver that keeps a received payload
//! for lack of a buffer and retries at its next poll need not keep the
//! core thread spinning: the thread may sleep, and the release wakes it
//! for the round in which the retry succeeds. A release that nobody
//! waits for costs what it did (one read-modify-write of the buffer's
//! state and one load of the mark): no lock, no system call.
//!
//! The mark and the states form the store-buffering pattern: the claimer
//! stores the mark, then scans the states again; the releaser frees a
//! state, then loads the mark; all four accesses are SeqCst, so at least
//! one side sees the other's write (the claimer finds the freed buffer, or
//! the releaser finds the mark and rings). This is the store-buffering
//! litmus test, forbidden for SeqCst accesses by their single total order
//! (C++20 [atomics.order], which Rust's atomics follow); the failed
//! compare-exchanges of the second scan are SeqCst loads in that order.

use super::mem::OwnedMem;
use super::peer;
use crate::limits;
use ringfence_ring::Status;
use ringfence_ring::{Doorbell, WakeFlag};
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

const FREE: u8 = 0;
const FILLING: u8 = 1;
const FULL: u8 = 2;
const READING: u8 = 3;

/// The most notification buffers a worker can have (buffer ids are 16 bits).
pub const MAX_NOTIFY_BUFFERS: u32 = 1 << 16;

/// A notification that has landed in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// The buffer holding the payload.
    pub buffer: u16,
    /// Payload length.
    pub len: u32,
    /// The sender's tag.
    pub tag: u64,
}

/// A worker's notification buffers.
pub struct NotifyPool {
    mem: Option<OwnedMem>,
    size: u32,
    states: Box<[AtomicU8]>,
    /// Landed, not yet posted as CQEs; capacity `count`, never more.
    delivered: Mutex<VecDeque<Delivery>>,
    /// Whether `delivered` may be non-empty: lets the progress loop skip the
    /// lock on rounds with nothing delivered. Set under the lock after a
    /// push, cleared under the lock when a drain empties the queue.
    maybe_delivered: AtomicBool,
    /// Set while the target's core thread sleeps: a delivery must ring
    /// `waker` (the store-buffering pattern of the rings' NEED_WAKEUP).
    sleeping: WakeFlag,
    waker: OnceLock<Arc<Doorbell>>,
    /// A claim found every buffer taken and nobody rang `waker` for it
    /// yet. Set (SeqCst) by `deliver` before its second scan; cleared by
    /// the first `release` that frees a buffer after it, which rings
    /// `waker`. It may stay set after the second scan found a buffer after
    /// all (another claimer's mark cannot be told apart): the next release
    /// then rings once for nothing, which only costs the core thread a
    /// round.
    wanted: AtomicBool,
}

impl fmt::Debug for NotifyPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotifyPool")
            .field("count", &self.states.len())
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl NotifyPool {
    /// `count` buffers of `size` bytes (both may be zero: no notifications).
    ///
    /// The buffers are one allocation counted against the process's memory
    /// limit ([`crate::limits`]); a large one is an anonymous mapping whose
    /// pages the kernel zeroes as they are first written, so creating a
    /// pool costs neither a fill nor resident memory.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for more than [`MAX_NOTIFY_BUFFERS`];
    /// [`Status::NoMemory`] if the buffers exceed the memory limit or
    /// cannot be allocated.
    pub fn new(count: u32, size: u32) -> Result<NotifyPool, Status> {
        let bytes = Self::bytes(count, size)?;
        let reservation = match bytes {
            0 => None,
            _ => Some(limits::reserve(bytes).map_err(|_| Status::NoMemory)?),
        };
        Self::reserved(count, size, reservation)
    }

    /// The bytes `count` buffers of `size` take.
    ///
    /// # Errors
    /// As [`new`](Self::new), before anything is allocated.
    pub(crate) fn bytes(count: u32, size: u32) -> Result<usize, Status> {
        if count > MAX_NOTIFY_BUFFERS {
            return Err(Status::InvalidArgument);
        }
        (count as usize)
            .checked_mul(size as usize)
            .ok_or(Status::NoMemory)
    }

    /// As [`new`](Self::new), with the caller's reservation of
    /// [`bytes`](Self::bytes) (`None` for a pool of none).
    pub(crate) fn reserved(
        count: u32,
        size: u32,
        reservation: Option<limits::Reservation>,
    ) -> Result<NotifyPool, Status> {
        let bytes = Self::bytes(count, size)?;
        let mem = match reservation {
            Some(reservation) if bytes > 0 => {
                Some(OwnedMem::new(bytes, reservation).ok_or(Status::NoMemory)?)
            }
            _ => None,
        };
        Ok(NotifyPool {
            mem,
            size,
            states: (0..count).map(|_| AtomicU8::new(FREE)).collect(),
            delivered: Mutex::new(VecDeque::with_capacity(count as usize)),
            maybe_delivered: AtomicBool::new(false),
            sleeping: WakeFlag::new(),
            waker: OnceLock::new(),
            wanted: AtomicBool::new(false),
        })
    }

    /// Number of buffers.
    pub fn count(&self) -> u32 {
        self.states.len() as u32
    }

    /// Bytes per buffer.
    pub fn buffer_size(&self) -> u32 {
        self.size
    }

    /// Copies a payload from `src` into a free buffer and queues its
    /// delivery.
    ///
    /// # Errors
    /// [`Status::Truncated`] if `len` exceeds the buffer size (or there are
    /// no buffers at all: every payload is too large then);
    /// [`Status::NoResource`] if every buffer is in use (retry later): the
    /// release that frees the next one rings the worker's SQ doorbell, so a
    /// driver that keeps the payload and retries from its `poll` may let
    /// the core thread sleep meanwhile (the module docs, "A full pool").
    ///
    /// # Safety
    /// - `[src, src + len)` is readable memory of a live registration.
    pub unsafe fn deliver(&self, src: u64, len: u32, tag: u64) -> Result<(), Status> {
        let Some(mem) = self.mem.as_ref().filter(|_| len <= self.size) else {
            return Err(Status::Truncated);
        };
        // Acquire: the application's reads of the buffer are done before
        // we fill it; pairs with the release's SeqCst (a release) CAS.
        let buffer = match self.claim(Ordering::Acquire, Ordering::Relaxed) {
            Some(buffer) => buffer,
            None => {
                // SeqCst, then a second scan with SeqCst loads: pairs with
                // the CAS and the load of `wanted` in `release` (the
                // module docs, "A full pool").
                self.wanted.store(true, Ordering::SeqCst);
                self.claim(Ordering::SeqCst, Ordering::SeqCst)
                    .ok_or(Status::NoResource)?
            }
        };
        let dst = mem.addr() + buffer as u64 * u64::from(self.size);
        // SAFETY: the source is valid (contract), and may be memory a peer
        // writes meanwhile (a channel): the buffer then holds garbage,
        // never more than `len` bytes; the destination is buffer `buffer`,
        // inside `mem` (`buffer < count`, `len <= size`), and ours alone in
        // state FILLING.
        unsafe {
            peer::copy_from_peer(
                src as usize as *const u8,
                dst as usize as *mut u8,
                len as usize,
            )
        };
        // Release: publishes the payload; pairs with the Acquire in `read`.
        self.states[buffer].store(FULL, Ordering::Release);
        let delivery = Delivery {
            buffer: buffer as u16,
            len,
            tag,
        };
        {
            let mut queue = self.delivered.lock().unwrap_or_else(|e| e.into_inner());
            queue.push_back(delivery);
            // Release: pairs with the Acquire in `drain`.
            self.maybe_delivered.store(true, Ordering::Release);
        }
        // Its SeqCst fence orders the delivery above before the flag load;
        // pairs with the fence of `announce` in `begin_sleep`.
        if self.sleeping.is_announced()
            && let Some(waker) = self.waker.get()
        {
            let _ = waker.ring();
        }
        Ok(())
    }

    /// Takes a free buffer (FREE → FILLING) with these orderings for the
    /// successful and the failed compare-exchanges.
    fn claim(&self, success: Ordering, failure: Ordering) -> Option<usize> {
        self.states
            .iter()
            .position(|s| s.compare_exchange(FREE, FILLING, success, failure).is_ok())
    }

    /// The doorbell a delivery rings while the target sleeps, and a
    /// release after a claim found the pool full (set once).
    pub(crate) fn set_waker(&self, waker: Arc<Doorbell>) {
        let _ = self.waker.set(waker);
    }

    /// The target is about to sleep: returns `false` (and stays awake) if a
    /// delivery is already waiting.
    pub(crate) fn begin_sleep(&self) -> bool {
        // Its SeqCst fence orders the flag before the queue check; pairs
        // with the fence of `is_announced` in `deliver`.
        self.sleeping.announce();
        let empty = self
            .delivered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if !empty {
            self.end_sleep();
        }
        empty
    }

    /// The target is awake again.
    pub(crate) fn end_sleep(&self) {
        self.sleeping.withdraw();
    }

    /// Hands queued deliveries to `sink` until it returns `false` (out of CQ
    /// room); the rest stay queued in order.
    pub(crate) fn drain(&self, mut sink: impl FnMut(Delivery) -> bool) {
        // Acquire: pairs with the Release in `deliver`. A stale `false`
        // only delays the delivery to the next round.
        if !self.maybe_delivered.load(Ordering::Acquire) {
            return;
        }
        let mut queue = self.delivered.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(&d) = queue.front() {
            if !sink(d) {
                break;
            }
            queue.pop_front();
        }
        if queue.is_empty() {
            self.maybe_delivered.store(false, Ordering::Relaxed);
        }
    }

    /// Takes buffer `buffer` for reading: `Some` once per delivery.
    pub(crate) fn read(&self, buffer: u16, len: u32) -> Option<&[u8]> {
        let state = self.states.get(buffer as usize)?;
        // Acquire: the payload written before FULL is visible.
        state
            .compare_exchange(FULL, READING, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        let mem = self.mem.as_ref()?;
        let len = len.min(self.size) as usize;
        // SAFETY: the pool's memory is private (`OwnedMem::new`: the heap or
        // a private anonymous mapping), never registered, so no peer
        // reaches it; buffer `buffer` is ours in state READING, and no
        // driver writes a buffer that is not FREE, so it stays unchanged
        // until `release`.
        Some(unsafe { mem.slice(buffer as usize * self.size as usize, len) })
    }

    /// Gives buffer `buffer` back after `read`; rings the waker if a claim
    /// found the pool full since the last such ring (the module docs, "A
    /// full pool").
    pub(crate) fn release(&self, buffer: u16) {
        let Some(state) = self.states.get(buffer as usize) else {
            return;
        };
        // SeqCst (a release: our reads are done before a driver refills
        // it, pairing with the Acquire CAS in `claim`), then a SeqCst load
        // of `wanted`: pairs with the store and second scan in `deliver`.
        // On x86_64 the CAS is the same `lock cmpxchg` as with Release and
        // the load a plain `mov`.
        let freed = state
            .compare_exchange(READING, FREE, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok();
        // The swap makes one release ring per mark, however many see it.
        if freed
            && self.wanted.load(Ordering::SeqCst)
            && self.wanted.swap(false, Ordering::SeqCst)
            && let Some(waker) = self.waker.get()
        {
            let _ = waker.ring();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliver_read_release_cycle() {
        let pool = NotifyPool::new(2, 8).unwrap();
        // 8-aligned, so that the 8-byte delivery takes the word copy every
        // time; mutable, as a peer's memory is (the copy reads words
        // through atomics, which miri checks against the pointer's tag).
        #[repr(align(8))]
        struct Aligned([u8; 8]);
        let mut payload = Aligned(*b"hello!!!");
        let src = payload.0.as_mut_ptr() as usize as u64;
        // SAFETY: `payload` is readable for 8 bytes; the 9-byte delivery is
        // refused before anything is read.
        unsafe {
            pool.deliver(src, 5, 7).unwrap();
            pool.deliver(src, 8, 8).unwrap();
            assert_eq!(pool.deliver(src, 1, 9), Err(Status::NoResource));
            assert_eq!(pool.deliver(src, 9, 9), Err(Status::Truncated));
        }
        let mut got = Vec::new();
        pool.drain(|d| {
            got.push(d);
            true
        });
        assert_eq!(
            got,
            vec![
                Delivery {
                    buffer: 0,
                    len: 5,
                    tag: 7
                },
                Delivery {
                    buffer: 1,
                    len: 8,
                    tag: 8
                }
            ]
        );
        assert_eq!(pool.read(0, 5), Some(&b"hello"[..]));
        assert_eq!(pool.read(0, 5), None, "a buffer is read once per delivery");
        pool.release(0);
        // SAFETY: as above.
        unsafe { pool.deliver(src, 2, 10).unwrap() };
        assert_eq!(pool.read(0, 2), Some(&b"he"[..]));
        assert_eq!(pool.read(9, 2), None);
        let empty = NotifyPool::new(0, 0).unwrap();
        // SAFETY: nothing is read: there are no buffers.
        assert_eq!(unsafe { empty.deliver(src, 1, 0) }, Err(Status::Truncated));
        assert!(NotifyPool::new(MAX_NOTIFY_BUFFERS + 1, 1).is_err());
    }

    /// A claim that finds the pool full marks it; the release that frees a
    /// buffer then rings the waker, once; releases nobody waits for, and
    /// deliveries while the target is awake, ring nothing.
    #[test]
    #[cfg_attr(miri, ignore = "an eventfd")]
    fn a_release_after_a_claim_found_the_pool_full_rings_the_waker_once() {
        let pool = NotifyPool::new(2, 8).unwrap();
        let bell = Arc::new(Doorbell::new().unwrap());
        pool.set_waker(bell.clone());
        let mut payload = *b"payload!";
        // Mutable, as a peer's memory is (`peer::copy_from_peer`).
        let src = payload.as_mut_ptr() as usize as u64;
        let fill = || {
            // SAFETY: `payload` is readable for 8 bytes.
            unsafe {
                pool.deliver(src, 8, 1).unwrap();
                pool.deliver(src, 8, 2).unwrap();
            }
            let mut n = 0;
            pool.drain(|d| {
                assert!(pool.read(d.buffer, d.len).is_some());
                n += 1;
                true
            });
            assert_eq!(n, 2);
        };
        // Full, and nobody wanted a buffer: releases ring nothing.
        fill();
        assert!(
            !bell.clear().unwrap(),
            "deliveries while awake ring nothing"
        );
        pool.release(0);
        pool.release(1);
        assert!(!bell.clear().unwrap(), "a release nobody waits for");
        // Full, and a claim fails: the first release rings, the second not.
        fill();
        // SAFETY: as above.
        assert_eq!(unsafe { pool.deliver(src, 8, 3) }, Err(Status::NoResource));
        assert!(
            !bell.clear().unwrap(),
            "the failed claim itself rings nothing"
        );
        pool.release(1);
        assert!(bell.clear().unwrap(), "the release after the failed claim");
        pool.release(0);
        assert!(!bell.clear().unwrap(), "once per failed claim");
        // Twice full and failed before any release: still one ring.
        fill();
        for tag in [4, 5] {
            // SAFETY: as above.
            let claimed = unsafe { pool.deliver(src, 8, tag) };
            assert_eq!(claimed, Err(Status::NoResource));
        }
        pool.release(0);
        pool.release(1);
        assert!(bell.clear().unwrap());
        assert!(!bell.clear().unwrap(), "one write: the counter was 1");
        // A release of a buffer not being read frees nothing, rings nothing.
        fill();
        // SAFETY: as above.
        assert_eq!(unsafe { pool.deliver(src, 8, 6) }, Err(Status::NoResource));
        pool.release(9);
        assert!(!bell.clear().unwrap(), "nothing freed");
        pool.release(0);
        assert!(bell.clear().unwrap());
        // The retry after the wake finds the freed buffer.
        // SAFETY: as above.
        assert_eq!(unsafe { pool.deliver(src, 8, 7) }, Ok(()));
    }
}
