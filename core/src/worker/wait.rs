//! Bounded waits for completions: at least N CQEs, or a deadline.
//!
//! Whoever waits must make sure the CQEs can come. Without a core thread
//! nothing progresses unless this thread does, so the wait runs progress
//! rounds inline (yielding the CPU when a round finds nothing, as every
//! busy-poller here must on a shared core). With a core thread it sleeps on
//! the CQ doorbell, armed with NEED_WAKEUP (the protocol of
//! `Consumer::prepare_wait`), and looks again after each ring: the engine
//! rings once per round that posts while the flag is set, so a wait for
//! several CQEs may wake more than once. Either way the deadline is
//! checked before every round and every sleep, so the wait never runs
//! past it by more than one round.

use super::Shared;
use ringfence_ring::{Consumer, Cqe, Doorbell, Status};
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::time::{Duration, Instant};

/// Empty inline rounds between two yields of the CPU.
const SPINS_PER_YIELD: u32 = 64;

/// How a wait reads the CQ it waits on.
pub(crate) trait CqView {
    /// CQEs ready to reap now.
    ///
    /// # Errors
    /// `RingCorrupt` if the shared indices are inconsistent.
    fn ready(&mut self) -> Result<u32, Status>;
    /// Sets or clears NEED_WAKEUP in the CQ's consumer flags (Relaxed: the
    /// wait orders it with a fence).
    fn set_need_wakeup(&mut self, on: bool);
    /// The CQ's capacity.
    fn capacity(&self) -> u32;
}

/// A CQ whose consumer side was taken over (the C ABI's): counted from the
/// head the taker published in ring memory.
#[derive(Debug)]
pub(crate) struct Published<'a>(pub &'a mut Consumer<Cqe>);

impl CqView for Published<'_> {
    fn ready(&mut self) -> Result<u32, Status> {
        self.0.ready_published().map_err(|_| Status::RingCorrupt)
    }

    fn set_need_wakeup(&mut self, on: bool) {
        self.0.set_need_wakeup(on);
    }

    fn capacity(&self) -> u32 {
        self.0.capacity()
    }
}

impl CqView for Consumer<Cqe> {
    fn ready(&mut self) -> Result<u32, Status> {
        Consumer::ready(self).map_err(|_| Status::RingCorrupt)
    }

    fn set_need_wakeup(&mut self, on: bool) {
        if on {
            self.request_wakeup();
        } else {
            self.finish_wait();
        }
    }

    fn capacity(&self) -> u32 {
        Consumer::capacity(self)
    }
}

/// Waits until `cq` holds at least `nr` CQEs, or `timeout` passes (`None`:
/// no limit). Returns the count ready (at least `nr`).
///
/// A queue pair that failed (`failed`, set by the engine before it rings
/// `bell`) ends the wait as soon as fewer than `nr` CQEs are ready.
///
/// # Errors
/// `Timeout` when the deadline passed first; `InvalidArgument` if `nr` is
/// more than the CQ holds; `RingCorrupt` (corrupt indices, or the queue
/// pair failed); `Io` if the doorbell fails.
pub(crate) fn wait_cqes(
    shared: &Shared,
    bell: &Doorbell,
    failed: &AtomicBool,
    cq: &mut impl CqView,
    nr: u32,
    timeout: Option<Duration>,
) -> Result<u32, Status> {
    if nr > cq.capacity() {
        return Err(Status::InvalidArgument);
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let left = || match deadline {
        None => Ok(None),
        Some(d) => d
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
            .map(Some)
            .ok_or(Status::Timeout),
    };
    let mut idle = 0u32;
    loop {
        let ready = cq.ready()?;
        if ready >= nr {
            return Ok(ready);
        }
        // Acquire: pairs with the Release store in `EngineQueue::fail`. The
        // engine rings `bell` after it, so a sleep below cannot miss it.
        if failed.load(Ordering::Acquire) {
            return Err(Status::RingCorrupt);
        }
        let left = left()?;
        if !shared.core_running() {
            // This thread is the progress loop.
            if shared.engine().progress() > 0 {
                idle = 0;
            } else {
                idle += 1;
                if idle.is_multiple_of(SPINS_PER_YIELD) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            continue;
        }
        cq.set_need_wakeup(true);
        // SeqCst fence: the flag store before the tail load, against the
        // engine's fence between its tail store and its flag load
        // (`Producer::needs_wakeup`): one of the two sees the other.
        fence(Ordering::SeqCst);
        let slept = if cq.ready()? >= nr {
            Ok(true)
        } else {
            bell.wait(left)
        };
        cq.set_need_wakeup(false);
        slept.map_err(|_| Status::Io)?;
    }
}
