//! The bookkeeping of one queue pair: which transfer each SQE in flight
//! belongs to, each transfer's results, the notification CQEs not yet
//! handed to Python, and the staging memory of notification payloads
//! given as bytes.
//!
//! Every SQE the package pushes carries a `user_data` that names a slot
//! here (index and generation). Its one CQE frees the slot and fills one
//! result of its transfer, so a transfer is done when each of its
//! operations has had its completion: exactly once, since a slot is freed
//! by the first CQE that names it and a CQE naming a free slot or another
//! generation changes nothing.

use crate::errors::{Fail, Res};
use crate::memory::{MemInner, RemoteInner};
use ringfence::{Cqe, RegisteredBuf, Worker};
use ringfence_ring::LocalBuf;
use std::collections::VecDeque;
use std::sync::Arc;

/// What a posted batch uses, kept registered (and its keys unpacked) until
/// each of its operations completed, whatever happens to the Python
/// objects meanwhile.
#[derive(Debug, Default)]
#[allow(dead_code)] // held, never read: dropping the last one lets them go
pub(crate) struct Keep {
    pub(crate) mems: Vec<Arc<MemInner>>,
    pub(crate) remotes: Vec<Arc<RemoteInner>>,
}

/// A result not in yet (no status is this value).
pub(crate) const PENDING: i32 = i32::MIN;

/// A slot's transfer field when the slot is free.
const FREE: u32 = u32::MAX;
/// A slot's transfer field for the package's own SQEs (the CLOSEs of
/// `Worker.close`): their results go nowhere.
pub(crate) const INTERNAL: u32 = u32::MAX - 1;

/// Notification payload slots per chunk of staging memory.
const STAGING_SLOTS: u32 = 64;

#[derive(Debug)]
struct Slot {
    generation: u32,
    /// The transfer, [`FREE`] or [`INTERNAL`].
    transfer: u32,
    /// The operation's index in its transfer.
    index: u32,
    /// The staging slot of its payload, if it had one.
    staging: Option<u32>,
}

/// One posted batch's results, by operation.
#[derive(Debug)]
struct Record {
    generation: u32,
    live: bool,
    /// Its `Transfer` object is gone: the record goes when the last result
    /// comes in.
    orphan: bool,
    remaining: u32,
    results: Vec<i32>,
    keep: Option<Arc<Keep>>,
}

/// Names one transfer record: index and generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TransferId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// Registered memory for notification payloads that Python gave as bytes:
/// chunks of [`STAGING_SLOTS`] slots of `slot_size` bytes, allocated as
/// needed. A slot is taken at post and given back by its NOTIFY's CQE.
#[derive(Debug)]
struct Staging {
    chunks: Vec<RegisteredBuf>,
    free: Vec<u32>,
    slot_size: u32,
}

impl Staging {
    fn take(&mut self, worker: &Worker, payload: &[u8]) -> Res<(u32, LocalBuf)> {
        if payload.len() > self.slot_size as usize {
            return Err(Fail::new(
                ringfence_ring::Status::InvalidLength,
                format!(
                    "a notification payload given as bytes holds at most {} bytes (the \
                     worker's notify_size); pass a registered Memory for more (the peer's \
                     notify_size is the limit then)",
                    self.slot_size
                ),
            ));
        }
        if self.free.is_empty() {
            let chunk = worker.alloc_registered((self.slot_size * STAGING_SLOTS) as usize)?;
            let base = self.chunks.len() as u32 * STAGING_SLOTS;
            self.chunks.push(chunk);
            self.free.extend((base..base + STAGING_SLOTS).rev());
        }
        let slot = self.free.pop().expect("a free slot was just ensured");
        let chunk = &self.chunks[(slot / STAGING_SLOTS) as usize];
        let offset = (slot % STAGING_SLOTS) * self.slot_size;
        chunk.write(offset as usize, payload);
        Ok((slot, chunk.local(u64::from(offset))))
    }

    fn give_back(&mut self, slot: u32) {
        self.free.push(slot);
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Book {
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    records: Vec<Record>,
    free_records: Vec<u32>,
    /// Incoming notification CQEs (their buffers stay taken until read).
    pub(crate) notifications: VecDeque<Cqe>,
    staging: Staging,
    /// SQEs pushed whose CQE has not come yet.
    outstanding: usize,
    /// What finished transfers kept: to drop once the queue is unlocked
    /// (dropping the last reference deregisters, which must not happen
    /// under the queue lock).
    pub(crate) released: Vec<Arc<Keep>>,
}

impl Book {
    pub(crate) fn new(notify_size: u32) -> Book {
        Book {
            slots: Vec::new(),
            free_slots: Vec::new(),
            records: Vec::new(),
            free_records: Vec::new(),
            notifications: VecDeque::new(),
            staging: Staging {
                chunks: Vec::new(),
                free: Vec::new(),
                slot_size: notify_size.max(64),
            },
            outstanding: 0,
            released: Vec::new(),
        }
    }

    /// SQEs pushed whose CQE has not come yet.
    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// A record for a transfer of `ops` operations, all pending, keeping
    /// `keep` until they completed.
    pub(crate) fn new_transfer(&mut self, ops: u32, keep: Option<Arc<Keep>>) -> TransferId {
        let index = match self.free_records.pop() {
            Some(i) => i,
            None => {
                self.records.push(Record {
                    generation: 0,
                    live: false,
                    orphan: false,
                    remaining: 0,
                    results: Vec::new(),
                    keep: None,
                });
                (self.records.len() - 1) as u32
            }
        };
        let r = &mut self.records[index as usize];
        r.live = true;
        r.orphan = false;
        r.remaining = ops;
        r.results.clear();
        r.results.resize(ops as usize, PENDING);
        r.keep = keep;
        TransferId {
            index,
            generation: r.generation,
        }
    }

    fn record(&self, id: TransferId) -> Option<&Record> {
        self.records
            .get(id.index as usize)
            .filter(|r| r.live && r.generation == id.generation)
    }

    /// Operation `index` of transfer `t` completed with `res`.
    fn complete(&mut self, t: u32, index: u32, res: i32) {
        let r = &mut self.records[t as usize];
        r.results[index as usize] = res;
        r.remaining -= 1;
        if r.remaining == 0 {
            if let Some(keep) = r.keep.take() {
                self.released.push(keep);
            }
            if r.orphan {
                self.free_record(t);
            }
        }
    }

    fn free_record(&mut self, index: u32) {
        let r = &mut self.records[index as usize];
        if let Some(keep) = r.keep.take() {
            self.released.push(keep);
        }
        r.live = false;
        r.generation = r.generation.wrapping_add(1);
        self.free_records.push(index);
    }

    /// Whether every operation of `id` has its result.
    pub(crate) fn is_done(&self, id: TransferId) -> bool {
        self.record(id).is_none_or(|r| r.remaining == 0)
    }

    /// The results of `id` so far ([`PENDING`] where none came yet).
    pub(crate) fn results(&self, id: TransferId) -> Vec<i32> {
        self.record(id)
            .map(|r| r.results.clone())
            .unwrap_or_default()
    }

    /// Frees the record of a transfer that was never posted.
    pub(crate) fn discard(&mut self, id: TransferId) {
        if self.record(id).is_some() {
            self.free_record(id.index);
        }
    }

    /// The `Transfer` object of `id` is gone: its record goes now if it is
    /// done, else when its last result comes.
    pub(crate) fn drop_transfer(&mut self, id: TransferId) {
        let Some(r) = self.record(id) else { return };
        if r.remaining == 0 {
            self.free_record(id.index);
        } else {
            self.records[id.index as usize].orphan = true;
        }
    }

    /// A slot for operation `index` of `transfer` (or an [`INTERNAL`]
    /// one), holding staging slot `staging`; returns the SQE's
    /// `user_data`.
    pub(crate) fn new_slot(&mut self, transfer: u32, index: u32, staging: Option<u32>) -> u64 {
        let i = match self.free_slots.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    transfer: FREE,
                    index: 0,
                    staging: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[i as usize];
        s.transfer = transfer;
        s.index = index;
        s.staging = staging;
        (u64::from(s.generation) << 32) | u64::from(i)
    }

    /// Gives back a slot taken for an SQE that was never pushed.
    pub(crate) fn cancel_slot(&mut self, user_data: u64) {
        let i = (user_data & 0xffff_ffff) as u32;
        let s = &mut self.slots[i as usize];
        if let Some(st) = s.staging.take() {
            self.staging.give_back(st);
        }
        s.transfer = FREE;
        s.generation = s.generation.wrapping_add(1);
        self.free_slots.push(i);
    }

    /// Records that an SQE is in the ring now.
    pub(crate) fn pushed(&mut self, n: usize) {
        self.outstanding += n;
    }

    /// A staging slot holding `payload`, and where it is.
    pub(crate) fn stage(&mut self, worker: &Worker, payload: &[u8]) -> Res<(u32, LocalBuf)> {
        self.staging.take(worker, payload)
    }

    /// Sets result `index` of `id` directly: for an operation that was
    /// never pushed (the worker closed under a post).
    pub(crate) fn settle(&mut self, id: TransferId, index: u32, res: i32) {
        let Some(r) = self.record(id) else { return };
        if r.results[index as usize] != PENDING {
            return;
        }
        self.complete(id.index, index, res);
    }

    /// Takes one CQE: a notification joins the queue; an operation's fills
    /// its transfer's result. Returns whether it was an operation's.
    pub(crate) fn route(&mut self, cqe: Cqe) -> bool {
        if cqe.buffer_id().is_some() {
            self.notifications.push_back(cqe);
            return false;
        }
        let i = (cqe.user_data & 0xffff_ffff) as u32;
        let generation = (cqe.user_data >> 32) as u32;
        let Some(s) = self.slots.get_mut(i as usize) else {
            return false;
        };
        if s.transfer == FREE || s.generation != generation {
            return false;
        }
        let (transfer, index) = (s.transfer, s.index);
        if let Some(st) = s.staging.take() {
            self.staging.give_back(st);
        }
        s.transfer = FREE;
        s.generation = s.generation.wrapping_add(1);
        self.free_slots.push(i);
        self.outstanding -= 1;
        if transfer != INTERNAL {
            self.complete(transfer, index, cqe.res);
        }
        true
    }

    /// Completes every SQE still outstanding with `res`: after the worker
    /// is gone, for any whose CQE never came (none should), so that every
    /// operation still gets exactly one result.
    pub(crate) fn settle_all(&mut self, res: i32) {
        let live: Vec<u64> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.transfer != FREE)
            .map(|(i, s)| (u64::from(s.generation) << 32) | i as u64)
            .collect();
        for user_data in live {
            self.route(Cqe::new(user_data, res, 0));
        }
    }
}
