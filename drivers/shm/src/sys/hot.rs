//! [`HotKey`]: the last mapped remote key a PUT or GET went through, with
//! raw pointers into its mappings (which it keeps alive), so that the next
//! operations through it (a stream of PUTs into one window, a ping-pong)
//! skip every lookup: no connection or key table, no `Option` chain, one
//! bounds check, one liveness load, the copy.
//!
//! It refuses exactly what the full path refuses (see `Shm::access`): a
//! range outside the target's bounds, an export the target revoked, a PUT
//! through a read-only mapping; and its caller checks the peer's liveness
//! once per run, as the full path does.

use super::region::SharedRegion;
use super::rma;
use crate::control::Liveness;
use ringfence::peer_mem::{copy_from_peer, copy_to_peer};
use ringfence::{DriverRkey, Op, OpKind};
use ringfence_ring::Status;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct HotKey {
    /// The driver's endpoint and key ids it stands for.
    pub(crate) ep: u32,
    pub(crate) rkey: DriverRkey,
    /// The connection's lanes: an operation names one of them.
    pub(crate) lanes: u8,
    /// The region's bounds (the target's), and where `base` is mapped here
    /// (the first byte of `_region`).
    base: u64,
    len: u64,
    map: NonNull<u8>,
    writable: bool,
    /// The export's word in the peer's status page (inside `_status`):
    /// live while it holds `generation`.
    live: NonNull<AtomicU64>,
    generation: u64,
    /// The connection's liveness (set when the peer dies).
    pub(crate) liveness: Arc<Liveness>,
    /// Keep `map` and `live` mapped while this value exists.
    _region: Arc<SharedRegion>,
    _status: Arc<SharedRegion>,
}

// SAFETY: the pointers name shared mappings (no thread affinity) that this
// value keeps alive through its `Arc`s; it is used only through `&self`
// by the driver that owns it, which is `Send`.
unsafe impl Send for HotKey {}

impl HotKey {
    /// A hot key for remote key `rkey` of endpoint `ep` (whose connection
    /// has `lanes` lanes): `region` is the key's whole region, mapped, its
    /// first byte at remote address `base`; the export is live while word
    /// `slot` of the peer's status page `status` holds `generation`.
    /// `None` if `status` has no such word.
    pub(crate) fn new(
        (ep, rkey, lanes): (u32, DriverRkey, u8),
        (region, base): (Arc<SharedRegion>, u64),
        (status, slot, generation): (Arc<SharedRegion>, u32, u32),
        liveness: Arc<Liveness>,
    ) -> Option<HotKey> {
        let live = NonNull::from(status.word(slot as usize * 8)?);
        Some(HotKey {
            ep,
            rkey,
            lanes,
            base,
            len: region.len() as u64,
            map: NonNull::new(region.ptr_at(0, 0)?)?,
            writable: region.is_writable(),
            live,
            generation: u64::from(generation),
            liveness,
            _region: region,
            _status: status,
        })
    }

    /// Starts moving the line at remote address `addr` to this CPU (for
    /// writing if `write`), if it lies inside the region. A hint only.
    #[inline]
    pub(crate) fn prefetch(&self, addr: u64, write: bool) {
        let offset = addr.wrapping_sub(self.base);
        if offset < self.len {
            // SAFETY: `offset < self.len`: inside `_region`'s mapping.
            let line = unsafe { self.map.as_ptr().add(offset as usize) };
            rma::prefetch(line, write);
        }
    }

    /// Runs PUT or GET `op` at remote address `addr`; `None` for any other
    /// operation (the full path takes it). The local range is the
    /// engine's, validated against a live registration (the
    /// `DirectPath::execute` contract). Always inlined: `execute`'s loop
    /// keeps the key's fields in registers across a run.
    #[inline(always)]
    pub(crate) fn access(&self, op: &Op, addr: u64) -> Option<Result<u32, Status>> {
        let put = match op.kind {
            OpKind::Put => true,
            OpKind::Get => false,
            _ => return None,
        };
        let len = u64::from(op.len);
        let offset = addr.wrapping_sub(self.base);
        if addr < self.base || offset > self.len || self.len - offset < len {
            return Some(Err(Status::OutOfBounds));
        }
        // SAFETY: `live` points into `_status`, mapped while `self` lives.
        let live = unsafe { self.live.as_ref() };
        // Acquire: pairs with the Release in `StatusPage::set_live`, as in
        // `Shm::access`.
        if live.load(Ordering::Acquire) != self.generation {
            return Some(Err(Status::AccessDenied));
        }
        if put && !self.writable {
            return Some(Err(Status::AccessDenied));
        }
        // SAFETY: `offset + len <= self.len` (checked), so the range lies
        // inside `_region`'s mapping, mapped while `self` lives and sealed
        // against shrinking (no page of it faults).
        let remote = unsafe { self.map.as_ptr().add(offset as usize) };
        let local = op.local_addr as usize as *mut u8;
        // SAFETY: the remote range as above (writable for a PUT: checked);
        // the local range readable and, for a GET, writable (the engine's
        // contract). Raw pointers only (the peer copy primitive, as in
        // `rma::mapped`); it tolerates overlap (a worker connected to
        // itself).
        unsafe {
            if put {
                copy_to_peer(local.cast_const(), remote, op.len as usize);
            } else {
                copy_from_peer(remote.cast_const(), local, op.len as usize);
            }
        }
        Some(Ok(op.len))
    }
}
