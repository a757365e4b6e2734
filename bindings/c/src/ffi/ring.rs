//! Rings: one SQ and one CQ per thread, handed to C as pointers into the
//! ring memory (`struct rf_ring`), and the few calls the inline helpers
//! need: waking the core thread, and the CQ's eventfd.

use super::worker::with_worker;
use super::{check_out, count, guard, read, write};
use crate::abi::{rf_cqe, rf_ring, rf_ring_t, rf_sqe, rf_worker_t};
use crate::table::{Kind, Table};
use core::ffi::{c_int, c_void};
use ringfence::QueuePair;
use ringfence_ring::{ConsumerLine, Cqe, Sqe, Status};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering, fence};
use std::sync::{Mutex, MutexGuard, RwLock};

/// A live ring: its queue pair (the owner of the ring memory that the C
/// side's pointers point into) and the worker it belongs to.
#[derive(Debug)]
pub(crate) struct RingEntry {
    worker: rf_worker_t,
    /// Locked only by the calls on this ring (one thread's, normally).
    qp: Mutex<QueuePair>,
}

impl RingEntry {
    fn qp(&self) -> MutexGuard<'_, QueuePair> {
        self.qp.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Every live ring. Lock order: `WORKERS`, then `RINGS`.
static RINGS: RwLock<Table<RingEntry>> = RwLock::new(Table::new(Kind::Ring));

/// Whether `worker` has a live ring.
pub(crate) fn worker_has_rings(worker: rf_worker_t) -> bool {
    read(&RINGS).values().any(|r| r.worker == worker)
}

/// Runs `f` on the live ring `*ring` names, under the read lock.
///
/// # Safety
/// - `ring` is NULL or points to a readable `struct rf_ring`.
unsafe fn with_ring<R>(
    ring: *const rf_ring,
    f: impl FnOnce(&RingEntry) -> Result<R, Status>,
) -> Result<R, Status> {
    if ring.is_null() || !ring.is_aligned() {
        return Err(Status::InvalidArgument);
    }
    // SAFETY: not NULL, aligned, readable (contract); only the handle is
    // read, a plain integer.
    let handle = unsafe { (*ring).handle };
    f(read(&RINGS).get(handle)?)
}

/// A ring whose pointers are all NULL and whose handle is `handle`.
fn empty_ring(handle: rf_ring_t) -> rf_ring {
    let null = core::ptr::null_mut();
    rf_ring {
        sq_tail: null,
        sq_shared_head: null,
        sq_shared_flags: null,
        sqes: core::ptr::null_mut(),
        sq_mask: 0,
        sq_entries: 0,
        sq_local_tail: 0,
        sq_published: 0,
        sq_cached_head: 0,
        sq_reserved: 0,
        cq_head: null,
        cq_shared_tail: null,
        cq_shared_flags: null,
        cq_wait_flags: null,
        cqes: core::ptr::null_mut(),
        cq_mask: 0,
        cq_entries: 0,
        cq_local_head: 0,
        cq_cached_tail: 0,
        handle,
        reserved: [0; 4],
    }
}

/// The C view of a queue pair's rings: the application side of both (SQ
/// producer, CQ consumer), taken over from the queue pair's own.
fn c_view(qp: &QueuePair, handle: rf_ring_t) -> rf_ring {
    let (sq, cq) = (qp.as_raw_sq(), qp.as_raw_cq());
    rf_ring {
        sq_tail: sq.tail.as_ptr(),
        sq_shared_head: sq.head.as_ptr(),
        sq_shared_flags: sq.consumer_flags.as_ptr(),
        sqes: sq.entries.as_ptr().cast::<rf_sqe>(),
        sq_mask: sq.capacity - 1,
        sq_entries: sq.capacity,
        sq_local_tail: sq.index,
        sq_published: sq.index,
        sq_cached_head: sq.cached_peer,
        sq_reserved: 0,
        cq_head: cq.head.as_ptr(),
        cq_shared_tail: cq.tail.as_ptr(),
        cq_shared_flags: cq.producer_flags.as_ptr(),
        cq_wait_flags: cq.consumer_flags.as_ptr(),
        cqes: cq.entries.as_ptr().cast::<rf_cqe>(),
        cq_mask: cq.capacity - 1,
        cq_entries: cq.capacity,
        cq_local_head: cq.index,
        cq_cached_tail: cq.cached_peer,
        ..empty_ring(handle)
    }
}

/// Creates a ring (one SQ of `sq_entries` and one CQ of `cq_entries`; 0
/// for the worker's configured sizes) for the calling thread, and fills
/// `*ring` for the inline helpers. The first ring of a worker also receives
/// its incoming notifications.
///
/// Returns 0; `RF_EINVALID_ARGUMENT` for a NULL `ring` or entry counts that
/// are not powers of two up to 65536; `RF_ENO_RESOURCE` past 4096 rings in
/// the worker's life (destroyed rings count: the engine keeps their
/// memory); `RF_ENO_MEMORY` if the ring memory cannot be allocated;
/// `RF_ESTALE_HANDLE`. `*ring` is written only on success.
///
/// # Safety
/// - `ring` is NULL or points to a writable `struct rf_ring`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ring_create(
    worker: rf_worker_t,
    sq_entries: u32,
    cq_entries: u32,
    ring: *mut rf_ring,
) -> c_int {
    guard(|| {
        let out = check_out(ring)?;
        with_worker(worker, |w| {
            let qp = match (sq_entries, cq_entries) {
                (0, 0) => w.worker.create_queue(),
                (sq, 0) => w
                    .worker
                    .create_queue_with(sq, sq.saturating_mul(2).min(1 << 16)),
                (0, cq) => w.worker.create_queue_with(w.worker.config().sq_entries, cq),
                (sq, cq) => w.worker.create_queue_with(sq, cq),
            }
            .map_err(|e| match e.status() {
                Status::NoMemory if !valid_entries(sq_entries) || !valid_entries(cq_entries) => {
                    Status::InvalidArgument
                }
                status => status,
            })?;
            let mut rings = write(&RINGS);
            let handle = rings.insert(RingEntry {
                worker,
                qp: Mutex::new(qp),
            })?;
            let view = c_view(&rings.get(handle)?.qp(), handle);
            // SAFETY: checked; writable (contract).
            unsafe { super::store(out, view) };
            Ok(0)
        })
    })
}

/// Zero (the default) or a power of two up to 65536.
fn valid_entries(n: u32) -> bool {
    n == 0 || (n.is_power_of_two() && n <= 1 << 16)
}

/// Destroys a ring; its pointers in `*ring` become NULL (the handle stays,
/// so a second destroy is `RF_ESTALE_HANDLE`). The engine keeps the ring's
/// memory until the worker is destroyed: SQEs submitted before still run,
/// and their completions land in a CQ that nobody reads. This is also how a
/// failed ring (`RF_ERING_CORRUPT`, see the inline helpers' "A failed
/// ring") is torn down: it always works, the engine reads nothing more from
/// that memory, and it finishes what it had taken from the ring (freeing
/// its request slots) without posting CQEs; `rf_progress` stops reporting
/// the ring.
///
/// Returns 0; `RF_ESTALE_HANDLE` for a destroyed ring;
/// `RF_EINVALID_ARGUMENT` for NULL or a handle that is not a ring's.
///
/// # Safety
/// - `ring` is NULL or points to a writable `struct rf_ring`, which no
///   other thread uses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ring_destroy(ring: *mut rf_ring) -> c_int {
    guard(|| {
        let ring = check_out(ring)?;
        // SAFETY: checked; readable (contract).
        let handle = unsafe { (*ring).handle };
        let entry = write(&RINGS).remove(handle)?;
        drop(entry);
        // SAFETY: checked; writable, and no other thread uses it (contract).
        unsafe { super::store(ring, empty_ring(handle)) };
        Ok(0)
    })
}

/// Wakes the worker's core thread after `rf_submit` published SQEs while it
/// slept (`RF_SQ_NEED_WAKEUP`). `rf_submit` calls it; calling it otherwise
/// is harmless.
///
/// Returns 0; `RF_ESTALE_HANDLE`; `RF_EINVALID_ARGUMENT`.
///
/// # Safety
/// - `ring` is NULL or points to a readable `struct rf_ring`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ring_wake(ring: *const rf_ring) -> c_int {
    guard(|| {
        // SAFETY: NULL or readable (contract).
        unsafe {
            with_ring(ring, |r| {
                r.qp().raw_submitted();
                Ok(0)
            })
        }
    })
}

/// Runs the PUT or GET `*sqe` at once, on this thread, where that keeps
/// every rule of the ring (see `QueuePair::try_now`): the engine would
/// start it at once anyway, the ring has no SQE the engine has not taken
/// (none taken with `rf_get_sqe` and not yet submitted either), and no
/// other thread is inside the engine. For the lowest latency; declined,
/// push it as usual.
///
/// Returns 1 when it ran: `*res` is its one completion (bytes, or the
/// negative status its CQE would carry) and no CQE follows; 0 when it
/// declined (nothing done, `*res` untouched); `RF_ERING_CORRUPT` if the
/// engine failed the ring (nothing done, `*res` untouched);
/// `RF_ESTALE_HANDLE`; `RF_EINVALID_ARGUMENT` for NULL or misaligned
/// pointers.
///
/// # Safety
/// - `ring` is NULL or points to a readable `struct rf_ring`;
/// - `sqe` is NULL or points to a readable `struct rf_sqe`;
/// - `res` is NULL or points to a writable `int32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ring_try_now(
    ring: *const rf_ring,
    sqe: *const rf_sqe,
    res: *mut i32,
) -> c_int {
    guard(|| {
        if sqe.is_null() || !sqe.is_aligned() || res.is_null() || !res.is_aligned() {
            return Err(Status::InvalidArgument);
        }
        // SAFETY: not NULL, aligned, readable (contract); `rf_sqe` is
        // `Sqe` (asserted in `abi`), and every bit pattern is a valid one.
        let sqe = unsafe { sqe.cast::<Sqe>().read() };
        // SAFETY: NULL or readable (contract); inside, `with_ring` has
        // checked that `ring` is not NULL and aligned.
        let ran = unsafe {
            with_ring(ring, |r| {
                // SQEs taken with `rf_get_sqe` and not yet submitted go
                // first.
                let pending = (*ring).sq_local_tail.wrapping_sub((*ring).sq_published);
                Ok(if pending != 0 {
                    None
                } else {
                    r.qp().try_now(&sqe)
                })
            })?
        };
        Ok(match ran {
            Some(Err(Status::RingCorrupt)) => return Err(Status::RingCorrupt),
            Some(result) => {
                let value = match result {
                    Ok(n) => i32::try_from(n).unwrap_or(i32::MAX),
                    Err(status) => status.as_raw(),
                };
                // SAFETY: not NULL, aligned, writable (contract).
                unsafe { res.write(value) };
                1
            }
            None => 0,
        })
    })
}

/// The CQ's eventfd, to put in epoll (or poll) for `EPOLLIN`. It becomes
/// readable when the engine posts CQEs while the ring is armed
/// (`rf_ring_cq_arm`). It belongs to the ring: do not close it.
///
/// Returns the descriptor (>= 0); `RF_ESTALE_HANDLE`;
/// `RF_EINVALID_ARGUMENT`.
///
/// # Safety
/// - `ring` is NULL or points to a readable `struct rf_ring`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ring_cq_fd(ring: *const rf_ring) -> c_int {
    // SAFETY: NULL or readable (contract).
    guard(|| unsafe { with_ring(ring, |r| Ok(r.qp().cq_doorbell().as_raw_fd())) })
}

/// Waits until at least `nr` CQEs are ready in `ring`'s CQ, or
/// `timeout_ns` nanoseconds pass (negative: no limit), as
/// `io_uring_wait_cqe_nr` with a timeout. Without a core thread it runs the
/// worker's progress on this thread meanwhile; with one it sleeps on the
/// CQ's eventfd. It never waits past the deadline by more than one
/// progress round. CQEs are counted from the head `rf_cq_advance`
/// published: call it from the thread that reaps the ring, after
/// advancing past what it consumed. `nr` = 0 returns the count at once.
///
/// Returns the count ready (at least `nr`); `RF_ETIMEOUT` if the deadline
/// passed first (what arrived stays to be reaped); `RF_EINVALID_ARGUMENT`
/// if `nr` is more than the CQ holds; `RF_ERING_CORRUPT` if the CQ's
/// indices are corrupt, or fewer than `nr` CQEs are ready and the engine
/// failed the ring (at once, not at the deadline); `RF_EIO` if the eventfd
/// fails; `RF_ESTALE_HANDLE`.
///
/// # Safety
/// - `ring` is NULL or points to a readable `struct rf_ring`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_wait_cqes(ring: *const rf_ring, nr: u32, timeout_ns: i64) -> c_int {
    let timeout = u64::try_from(timeout_ns)
        .ok()
        .map(std::time::Duration::from_nanos);
    guard(|| {
        // SAFETY: NULL or readable (contract).
        unsafe {
            with_ring(ring, |r| {
                let ready = r.qp().wait_cqes_published(nr, timeout)?;
                Ok(c_int::try_from(ready).unwrap_or(c_int::MAX))
            })
        }
    })
}

/// Whether the engine failed the ring: it found the ring memory corrupt
/// (see the inline helpers' "A failed ring"). The engine's own record, in
/// process memory: scribbles over the ring's flags do not hide it.
///
/// Returns 0 while the ring works; `RF_ERING_CORRUPT` once it failed
/// (destroy it); `RF_ESTALE_HANDLE`; `RF_EINVALID_ARGUMENT`.
///
/// # Safety
/// - `ring` is NULL or points to a readable `struct rf_ring`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ring_check(ring: *const rf_ring) -> c_int {
    guard(|| {
        // SAFETY: NULL or readable (contract).
        unsafe {
            with_ring(ring, |r| {
                r.qp().check()?;
                Ok(0)
            })
        }
    })
}

/// The CQ's shared words, for arming.
struct CqWords<'a> {
    tail: &'a AtomicU32,
    head: &'a AtomicU32,
    wait_flags: &'a AtomicU32,
    capacity: u32,
}

/// Runs `f` on the CQ's shared index words.
fn with_cq_words<R>(qp: &QueuePair, f: impl FnOnce(CqWords<'_>) -> R) -> R {
    let cq = qp.as_raw_cq();
    // SAFETY: the words live in the ring memory that `qp` keeps mapped for
    // the whole call (the borrow of `qp` outlives `f`), are aligned
    // `AtomicU32`s in layout (`ProducerLine`, `ConsumerLine`), and are only
    // ever accessed atomically, here and by the engine and the C helpers.
    let words = unsafe {
        CqWords {
            tail: AtomicU32::from_ptr(cq.tail.as_ptr()),
            head: AtomicU32::from_ptr(cq.head.as_ptr()),
            wait_flags: AtomicU32::from_ptr(cq.consumer_flags.as_ptr()),
            capacity: cq.capacity,
        }
    };
    f(words)
}

/// Arms the CQ's eventfd before sleeping in epoll: asks the engine to
/// signal it when it posts CQEs, then looks at the CQ once more (the same
/// protocol as the Rust `Consumer::prepare_wait`). Call it from the thread
/// that reaps the ring, after reaping with `rf_cq_advance`.
///
/// Returns 1: armed, the CQ is empty, sleep (the core thread must run);
/// 0: CQEs are ready, do not sleep (the ring is left unarmed);
/// `RF_ERING_CORRUPT` if the CQ's indices are inconsistent, or the CQ is
/// empty and the engine failed the ring (nothing will come; the ring is
/// left unarmed); `RF_ESTALE_HANDLE`; `RF_EINVALID_ARGUMENT`.
///
/// # Safety
/// - `ring` is NULL or points to a readable `struct rf_ring`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ring_cq_arm(ring: *const rf_ring) -> c_int {
    guard(|| {
        // SAFETY: NULL or readable (contract).
        unsafe {
            with_ring(ring, |r| {
                let qp = r.qp();
                let failed = qp.is_failed();
                with_cq_words(&qp, |cq| {
                    // Relaxed: ordered by the fence below. This thread is
                    // the CQ's only consumer, the flag's only writer.
                    cq.wait_flags
                        .store(ConsumerLine::NEED_WAKEUP, Ordering::Relaxed);
                    // SeqCst fence: orders the flag store before the tail
                    // load; pairs with the engine's fence in
                    // `Producer::needs_wakeup` after it publishes CQEs
                    // (store buffering; see `Consumer::prepare_wait`).
                    fence(Ordering::SeqCst);
                    // Acquire: pairs with the engine's Release store of the
                    // tail (`Producer::submit`).
                    let tail = cq.tail.load(Ordering::Acquire);
                    // Relaxed: this thread wrote the head (`rf_cq_advance`).
                    let head = cq.head.load(Ordering::Relaxed);
                    let ready = tail.wrapping_sub(head);
                    if ready == 0 && !failed {
                        return Ok(1);
                    }
                    cq.wait_flags.store(0, Ordering::Relaxed);
                    if ready == 0 {
                        return Err(Status::RingCorrupt);
                    }
                    if ready > cq.capacity {
                        Err(Status::RingCorrupt)
                    } else {
                        Ok(0)
                    }
                })
            })
        }
    })
}

/// Disarms the CQ's eventfd after waking (or instead of sleeping) and
/// clears it, so that it is not readable until the next armed post.
///
/// Returns 1 if the eventfd had been signalled, 0 if not; `RF_EIO` if it
/// cannot be read; `RF_ESTALE_HANDLE`; `RF_EINVALID_ARGUMENT`.
///
/// # Safety
/// - `ring` is NULL or points to a readable `struct rf_ring`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ring_cq_disarm(ring: *const rf_ring) -> c_int {
    guard(|| {
        // SAFETY: NULL or readable (contract).
        unsafe {
            with_ring(ring, |r| {
                let qp = r.qp();
                with_cq_words(&qp, |cq| {
                    // Relaxed: a stale flag costs the engine one spurious
                    // eventfd write.
                    cq.wait_flags.store(0, Ordering::Relaxed);
                });
                let rung = qp.cq_doorbell().clear().map_err(|_| Status::Io)?;
                Ok(c_int::from(rung))
            })
        }
    })
}

/// Copies the payload of an incoming notification CQE
/// (`RF_CQE_NOTIFICATION` in its flags; `res` is the length) into `buf`,
/// stores its length in `*len`, and gives the buffer back to the worker.
/// Every notification CQE must be read once, or its buffer stays taken.
///
/// Returns 0; `RF_ETRUNCATED` if `cap` is below `cqe->res` (nothing is
/// consumed; `*len` holds the size needed); `RF_EINVALID_ARGUMENT` for
/// NULL pointers or a CQE that is not a notification not yet read;
/// `RF_ESTALE_HANDLE`.
///
/// # Safety
/// - `ring` is NULL or points to a readable `struct rf_ring`; `cqe` is NULL
///   or points to a readable `struct rf_cqe`.
/// - `buf` is NULL or points to `cap` writable bytes; `len` is NULL or
///   points to a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_notification_read(
    ring: *const rf_ring,
    cqe: *const rf_cqe,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    guard(|| {
        let len = check_out(len)?;
        if cqe.is_null() || !cqe.is_aligned() || buf.is_null() {
            return Err(Status::InvalidArgument);
        }
        // SAFETY: not NULL, aligned, readable (contract); plain integers.
        let c = unsafe { cqe.read() };
        let cqe = Cqe::new(c.user_data, c.res, c.flags);
        let size = usize::try_from(cqe.res).map_err(|_| Status::InvalidArgument)?;
        if cqe.buffer_id().is_none() {
            return Err(Status::InvalidArgument);
        }
        // SAFETY: checked; writable (contract).
        unsafe { super::store(len, size) };
        if cap < size {
            return Err(Status::Truncated);
        }
        // SAFETY: NULL or readable (contract).
        unsafe {
            with_ring(ring, |r| {
                let qp = r.qp();
                let payload = qp.notification(&cqe).ok_or(Status::InvalidArgument)?;
                // SAFETY: `buf` has `cap >= size == payload.len()` writable
                // bytes (contract) and cannot overlap the library's buffer.
                core::ptr::copy_nonoverlapping(payload.as_ptr(), buf.cast::<u8>(), payload.len());
                Ok(count(payload.len()))
            })
        }
        .map(|_| 0)
    })
}
