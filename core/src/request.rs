//! Requests: one SQE in flight, 64 bytes, from a fixed per-queue pool.

use ringfence_ring::{Opcode, Sqe, SqeFlags};
use static_assertions::const_assert_eq;

/// "No request": the end of a list.
pub(crate) const NONE: u32 = u32::MAX;

/// Bits of [`Request::queue_slot`]: 12 bits of queue, 20 of slot.
pub(crate) const SLOT_BITS: u32 = 20;
/// The most requests one queue pair can have in flight.
pub const MAX_REQUESTS: u32 = 1 << SLOT_BITS;
/// The most queue pairs a worker can have.
pub const MAX_QUEUES: u32 = 1 << (32 - SLOT_BITS);

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// In the queue's free list.
    Free = 0,
    /// Accepted; waiting in its endpoint's FIFO or about to be started.
    Queued = 1,
    /// Handed to a driver; its completion will come from `poll`.
    Posted = 2,
}

/// One operation in flight. Exactly one cache line: UCX's `ucp_request_t`
/// is 280 bytes.
///
/// Everything the engine needs from the SQE is copied in at acceptance (the
/// ring memory is untrusted and may change), so a deferred request never
/// re-reads the SQ (docs/fence.md R3).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct Request {
    pub user_data: u64,
    pub local_addr: u64,
    pub remote_addr: u64,
    pub operand: u64,
    pub operand2: u64,
    pub len: u32,
    pub rkey: u32,
    pub local_mem: u32,
    /// Next request (a [`RequestId`] value) in the endpoint FIFO or the
    /// free list; [`NONE`] at the end.
    pub next: u32,
    /// Low 32 bits of the endpoint epoch captured at submission (R13).
    /// Compared by wrapping difference: fewer than 2^31 epochs are ever
    /// outstanding on one endpoint.
    pub epoch: u32,
    pub endpoint: u16,
    pub opcode: u8,
    /// `subop` (bits 0-1), SKIP_SUCCESS (bit 2), state (bits 3-4), holds a
    /// reference on its local registration (bit 5), a strong fence precedes
    /// it (bit 6; docs/fence.md R9).
    pub bits: u8,
}

const_assert_eq!(core::mem::size_of::<Request>(), 64);

const SUBOP_MASK: u8 = 0b11;
const SKIP: u8 = 1 << 2;
const STATE_SHIFT: u8 = 3;
const STATE_MASK: u8 = 0b11 << STATE_SHIFT;
const HOLDS_MEM: u8 = 1 << 5;
const STRONG: u8 = 1 << 6;

impl Request {
    pub(crate) const EMPTY: Request = Request {
        user_data: 0,
        local_addr: 0,
        remote_addr: 0,
        operand: 0,
        operand2: 0,
        len: 0,
        rkey: 0,
        local_mem: 0,
        next: NONE,
        epoch: 0,
        endpoint: 0,
        opcode: 0,
        bits: 0,
    };

    /// A queued request from a validated SQE (`opcode`, `subop` decoded).
    pub(crate) fn from_sqe(sqe: &Sqe, opcode: Opcode, endpoint: u16, flags: SqeFlags) -> Request {
        let skip = if flags.contains(SqeFlags::SKIP_SUCCESS) {
            SKIP
        } else {
            0
        };
        Request {
            user_data: sqe.user_data,
            local_addr: sqe.local_addr,
            remote_addr: sqe.remote_addr,
            operand: sqe.operand,
            operand2: sqe.operand2,
            len: sqe.len,
            rkey: sqe.rkey,
            local_mem: sqe.local_mem,
            next: NONE,
            epoch: 0,
            endpoint,
            opcode: opcode.as_raw(),
            bits: (sqe.subop & SUBOP_MASK) | skip | (State::Queued as u8) << STATE_SHIFT,
        }
    }

    pub(crate) fn opcode(&self) -> Opcode {
        Opcode::try_from(self.opcode).unwrap_or(Opcode::NOP)
    }

    pub(crate) fn subop(&self) -> u8 {
        self.bits & SUBOP_MASK
    }

    /// Whether this is a worker flush (a FLUSH of scope WORKER).
    pub(crate) fn is_worker_flush(&self) -> bool {
        self.opcode == Opcode::FLUSH.as_raw()
            && self.subop() == ringfence_ring::FlushScope::WORKER.as_raw()
    }

    pub(crate) fn skip_success(&self) -> bool {
        self.bits & SKIP != 0
    }

    pub(crate) fn state(&self) -> State {
        match (self.bits & STATE_MASK) >> STATE_SHIFT {
            1 => State::Queued,
            2 => State::Posted,
            _ => State::Free,
        }
    }

    pub(crate) fn set_state(&mut self, state: State) {
        self.bits = (self.bits & !STATE_MASK) | (state as u8) << STATE_SHIFT;
    }

    pub(crate) fn holds_mem(&self) -> bool {
        self.bits & HOLDS_MEM != 0
    }

    pub(crate) fn set_holds_mem(&mut self) {
        self.bits |= HOLDS_MEM;
    }

    /// Whether a strong fence (or a NOTIFY's implicit one) was submitted on
    /// the endpoint between the previous request and this one: the boundary
    /// before it must then be a flush, never a weak fence.
    pub(crate) fn strong_boundary(&self) -> bool {
        self.bits & STRONG != 0
    }

    pub(crate) fn set_strong_boundary(&mut self) {
        self.bits |= STRONG;
    }
}

/// Names a request: queue pair (12 bits) and slot (20 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestId(pub u32);

impl RequestId {
    pub(crate) fn new(queue: u32, slot: u32) -> RequestId {
        debug_assert!(queue < MAX_QUEUES && slot < MAX_REQUESTS);
        RequestId(queue << SLOT_BITS | slot)
    }

    pub(crate) fn queue(self) -> usize {
        (self.0 >> SLOT_BITS) as usize
    }

    pub(crate) fn slot(self) -> usize {
        (self.0 & (MAX_REQUESTS - 1)) as usize
    }
}

/// A fixed pool of requests with an intrusive free list.
#[derive(Debug)]
pub(crate) struct Pool {
    requests: Box<[Request]>,
    /// First free slot, or [`NONE`].
    free: u32,
    in_use: u32,
}

impl Pool {
    /// `size` requests, allocated once.
    pub(crate) fn new(size: u32) -> Pool {
        let mut requests = vec![Request::EMPTY; size as usize].into_boxed_slice();
        for (i, r) in requests.iter_mut().enumerate() {
            r.next = if i + 1 < size as usize {
                i as u32 + 1
            } else {
                NONE
            };
        }
        Pool {
            requests,
            free: if size == 0 { NONE } else { 0 },
            in_use: 0,
        }
    }

    /// Requests not in use.
    pub(crate) fn available(&self) -> u32 {
        self.requests.len() as u32 - self.in_use
    }

    pub(crate) fn in_use(&self) -> u32 {
        self.in_use
    }

    /// Takes a slot and fills it; `None` when the pool is exhausted.
    pub(crate) fn alloc(&mut self, request: Request) -> Option<u32> {
        let slot = self.free;
        let r = self.requests.get_mut(slot as usize)?;
        self.free = r.next;
        *r = request;
        self.in_use += 1;
        Some(slot)
    }

    /// The slot the next `alloc` takes; `None` when the pool is exhausted.
    pub(crate) fn next_free(&self) -> Option<u32> {
        (self.free != NONE).then_some(self.free)
    }

    /// Returns a slot to the free list.
    pub(crate) fn free(&mut self, slot: u32) {
        let r = &mut self.requests[slot as usize];
        debug_assert_ne!(r.state(), State::Free, "double free of request {slot}");
        *r = Request::EMPTY;
        r.next = self.free;
        self.free = slot;
        self.in_use -= 1;
    }

    pub(crate) fn get(&self, slot: usize) -> Option<&Request> {
        self.requests.get(slot)
    }

    pub(crate) fn get_mut(&mut self, slot: usize) -> Option<&mut Request> {
        self.requests.get_mut(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/fence.md W6: the request carries its fence epoch in existing space
    /// and stays one cache line (UCX's grew 272 -> 280 B with its fence).
    #[test]
    fn w6_a_request_is_one_cache_line() {
        assert_eq!(core::mem::size_of::<Request>(), 64);
        assert_eq!(core::mem::offset_of!(Request, epoch), 56);
    }

    #[test]
    fn bits_and_ids() {
        let sqe = Sqe {
            subop: 3,
            ..Sqe::put(1, Default::default(), Default::default(), 8)
        };
        let mut r = Request::from_sqe(&sqe, Opcode::PUT, 1, SqeFlags::SKIP_SUCCESS);
        assert_eq!(
            (r.opcode(), r.subop(), r.skip_success(), r.state()),
            (Opcode::PUT, 3, true, State::Queued)
        );
        r.set_state(State::Posted);
        r.set_holds_mem();
        assert_eq!(
            (r.state(), r.holds_mem(), r.subop(), r.skip_success()),
            (State::Posted, true, 3, true)
        );
        let id = RequestId::new(MAX_QUEUES - 1, MAX_REQUESTS - 1);
        assert_eq!(
            (id.queue(), id.slot()),
            ((MAX_QUEUES - 1) as usize, (MAX_REQUESTS - 1) as usize)
        );
    }

    #[test]
    fn pool_allocates_every_slot_once() {
        let mut pool = Pool::new(3);
        let q = |ud| Request {
            user_data: ud,
            ..Request::from_sqe(&Sqe::nop(), Opcode::NOP, 0, SqeFlags::EMPTY)
        };
        let a = pool.alloc(q(1)).unwrap();
        let b = pool.alloc(q(2)).unwrap();
        let c = pool.alloc(q(3)).unwrap();
        assert_eq!(pool.alloc(q(4)), None);
        assert_eq!((pool.available(), pool.in_use()), (0, 3));
        pool.free(b);
        assert_eq!(pool.alloc(q(5)), Some(b));
        assert_eq!(pool.get(a as usize).unwrap().user_data, 1);
        assert_eq!(pool.get(c as usize).unwrap().user_data, 3);
        assert_eq!(Pool::new(0).alloc(q(1)), None);
    }
}
