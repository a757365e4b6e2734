//! The completion side of a queue pair: CQEs posted in order, the overflow
//! list, the CQ doorbell; and the single place a request ends.

use super::{Engine, INTAKE_BATCH};
use crate::request::{Pool, RequestId};
use crate::stats::Stats;
use crate::sys::notify::Delivery;
use ringfence_ring::{
    CQE_BUFFER_SHIFT, Consumer, Cqe, CqeFlags, Doorbell, Opcode, Producer, RingError, Sqe, Status,
};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The engine's side of one queue pair.
#[derive(Debug)]
pub(crate) struct EngineQueue {
    pub(super) sq: Consumer<Sqe>,
    pub(super) cq: Producer<Cqe>,
    pub(super) pool: Pool,
    /// CQEs that found the CQ full, oldest first. Its capacity covers the
    /// most that can wait here (see `new`), so it never grows.
    pub(super) overflow: VecDeque<Cqe>,
    pub(super) cq_bell: Option<Arc<Doorbell>>,
    /// CQEs pushed this round, to publish.
    pub(super) pushed: bool,
    /// The ring memory was found corrupt (`fail`): nothing more is taken
    /// from the SQ or posted to the CQ.
    pub(super) broken: bool,
    /// `broken`, for the queue pair (in process memory, which the
    /// application cannot scribble over as it can the ring's flags).
    pub(super) failed: Arc<AtomicBool>,
    /// The application dropped its queue pair (`Engine::queue_dropped`).
    pub(super) dropped: bool,
}

impl EngineQueue {
    pub(crate) fn new(
        sq: Consumer<Sqe>,
        cq: Producer<Cqe>,
        requests: u32,
        notify_buffers: u32,
        cq_bell: Option<Arc<Doorbell>>,
        failed: Arc<AtomicBool>,
    ) -> EngineQueue {
        EngineQueue {
            sq,
            cq,
            pool: Pool::new(requests),
            // Bound: one CQE per request, per notification buffer, and per
            // SQE of the intake batch that overflowed (NOPs and invalid SQEs
            // complete without a request).
            overflow: VecDeque::with_capacity(
                requests as usize + notify_buffers as usize + INTAKE_BATCH,
            ),
            cq_bell,
            pushed: false,
            broken: false,
            failed,
            dropped: false,
        }
    }

    /// Fails this queue pair: its ring memory was found corrupt (`why`).
    /// What was pushed this round is published; then the engine marks both
    /// rings FAILED (the SQ's consumer flags, the CQ's producer flags, each
    /// one Release store), tells the queue pair, rings the CQ doorbell so
    /// that a sleeping waiter looks, and from then on takes no SQE and posts
    /// no CQE here: the overflow list and every later completion of this
    /// queue pair's requests are dropped (their slots are still freed, by
    /// `Engine::complete`). Nothing of the ring memory is read again.
    #[cold]
    pub(super) fn fail(&mut self, why: &dyn std::fmt::Display) {
        if self.broken {
            return;
        }
        tracing::error!(%why, dropped_cqes = self.overflow.len(), "queue pair failed: its ring memory is corrupt");
        self.broken = true;
        self.overflow.clear();
        self.pushed = false;
        // Publishes this round's CQEs, then sets FAILED.
        self.cq.fail();
        self.sq.fail();
        // Release: pairs with the Acquire loads in `QueuePair::check` and
        // the waits.
        self.failed.store(true, Ordering::Release);
        if let Some(bell) = &self.cq_bell
            && let Err(e) = bell.ring()
        {
            tracing::error!(error = %e, "CQ doorbell failed");
        }
    }

    /// Posts one CQE, or keeps it in order in the overflow list. Nothing,
    /// once the queue pair failed.
    pub(super) fn post(&mut self, cqe: Cqe, stats: &mut Stats) {
        if self.broken {
            return;
        }
        if self.overflow.is_empty() {
            match self.cq.push(cqe) {
                Ok(()) => {
                    self.pushed = true;
                    return;
                }
                Err(RingError::Full) => {}
                Err(RingError::Corrupt(c)) => return self.fail(&c),
            }
            self.cq.set_overflow(true);
        }
        stats.cq_overflows += 1;
        self.overflow.push_back(cqe);
    }

    /// Posts the CQE of an operation that finished with `result` (bytes or
    /// a status), unless it succeeded and asked to skip its CQE.
    #[inline]
    pub(super) fn finish(
        &mut self,
        user_data: u64,
        result: Result<u32, Status>,
        skip_success: bool,
        stats: &mut Stats,
    ) {
        let res = match result {
            Ok(_) if skip_success => return,
            Ok(n) => n.min(i32::MAX as u32) as i32,
            Err(status) => status.as_raw(),
        };
        self.post(Cqe::new(user_data, res, 0), stats);
    }

    /// Moves overflowed CQEs into the CQ while it has room.
    pub(crate) fn flush_overflow(&mut self) -> usize {
        let mut moved = 0;
        while let Some(&cqe) = self.overflow.front() {
            match self.cq.push(cqe) {
                Ok(()) => {}
                Err(RingError::Full) => break,
                Err(RingError::Corrupt(c)) => {
                    self.fail(&c);
                    return moved;
                }
            }
            self.overflow.pop_front();
            moved += 1;
        }
        if moved > 0 {
            self.pushed = true;
            if self.overflow.is_empty() {
                self.cq.set_overflow(false);
            }
        }
        moved
    }

    /// Publishes this round's CQEs; rings the doorbell of a sleeping reaper.
    pub(crate) fn publish(&mut self) {
        if self.pushed {
            self.pushed = false;
            self.cq.submit();
            if let Some(bell) = &self.cq_bell
                && self.cq.needs_wakeup()
                && let Err(e) = bell.ring()
            {
                tracing::error!(error = %e, "CQ doorbell failed");
            }
        }
    }
}

impl EngineQueue {
    pub(super) fn pool_len(&self) -> usize {
        self.pool.available() as usize + self.pool.in_use() as usize
    }
}

impl Engine {
    /// Completes an SQE that never became a request.
    pub(super) fn complete_now(
        &mut self,
        qi: usize,
        user_data: u64,
        result: Result<u32, Status>,
        skip_success: bool,
    ) {
        self.stats.ops += 1;
        self.stats.errors += u64::from(result.is_err());
        self.queues[qi].finish(user_data, result, skip_success, &mut self.stats);
    }

    /// The single place a request ends: releases what it held, counts it,
    /// posts its CQE (unless it asked to skip a success), frees its slot.
    pub(super) fn complete(&mut self, id: RequestId, result: Result<u32, Status>) {
        let request = *self.request(id);
        if request.holds_mem()
            && let Some(r) = self.mem.get_mut(request.local_mem)
        {
            r.inflight -= 1;
        }
        let opcode = request.opcode();
        let bytes = match (opcode, result) {
            (Opcode::PUT | Opcode::GET | Opcode::ATOMIC | Opcode::NOTIFY, Ok(n)) => n,
            _ => 0,
        };
        let error = u64::from(result.is_err());
        if opcode == Opcode::NOP || request.is_worker_flush() {
            self.stats.ops += 1;
            self.stats.errors += error;
        } else {
            self.count(request.endpoint as usize, 1, u64::from(bytes), error);
        }
        let q = &mut self.queues[id.queue()];
        q.finish(
            request.user_data,
            result,
            request.skip_success(),
            &mut self.stats,
        );
        q.pool.free(id.slot() as u32);
    }

    /// Counts `ops` finished operations of endpoint `e` (`bytes` moved,
    /// `errors` failed), in the worker's counters and the endpoint's.
    #[inline]
    pub(super) fn count(&mut self, e: usize, ops: u64, bytes: u64, errors: u64) {
        let add = |stats: &mut Stats| {
            stats.ops += ops;
            stats.bytes += bytes;
            stats.errors += errors;
        };
        add(&mut self.stats);
        if let Some(cold) = self.cold.get_mut(e) {
            add(&mut cold.stats);
        }
    }

    pub(super) fn post_notifications(&mut self) -> usize {
        let Some(qi) = self.notify_queue else {
            return 0;
        };
        let q = &mut self.queues[qi];
        if q.broken {
            // Nobody can be told: each delivery's buffer goes back unread.
            let notify = &self.notify;
            let mut dropped = 0usize;
            notify.drain(|d: Delivery| {
                if notify.read(d.buffer, d.len).is_some() {
                    notify.release(d.buffer);
                }
                dropped += 1;
                true
            });
            if dropped > 0 {
                tracing::warn!(dropped, "notifications dropped: their queue pair failed");
            }
            return 0;
        }
        if !q.overflow.is_empty() {
            return 0;
        }
        let mut posted = 0;
        self.notify.drain(|d: Delivery| {
            let flags = CqeFlags::NOTIFICATION.bits() | u32::from(d.buffer) << CQE_BUFFER_SHIFT;
            match q.cq.push(Cqe::new(d.tag, d.len as i32, flags)) {
                Ok(()) => {
                    posted += 1;
                    true
                }
                // Kept for the next round, which finds the pair broken
                // and gives the buffers back.
                Err(RingError::Corrupt(c)) => {
                    q.fail(&c);
                    false
                }
                Err(_) => false,
            }
        });
        if posted > 0 {
            q.pushed = true;
            self.stats.notifications += posted as u64;
        }
        posted
    }
}
