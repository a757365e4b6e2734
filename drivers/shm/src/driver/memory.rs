//! Registered memory: exports peers map or reach through cross memory
//! attach, their keys, quiesce, and the memfd memory this driver allocates.

//! [`Shm`]: the driver the engine calls.

use crate::export::{Backing, Export};
use crate::key::KeyBlob;
use crate::layout::CMA_ACTIVE_AT;
use crate::sys::alloc::ShmAlloc;
use ringfence::{
    DriverError, DriverMemKey, DriverMemory, MemDesc, MemKind, Prepared, Quiesce, Quiesced,
    Registered,
};
use ringfence_ring::Status;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::*;

impl Shm {
    pub(super) fn register_export(
        &mut self,
        mem: &MemDesc,
        _prepared: Prepared,
    ) -> Result<Registered, DriverError> {
        if mem.kind != MemKind::Host {
            return Err(err(Status::Unsupported, "shm registers host memory only"));
        }
        self.allocs.retain(|a| a.strong_count() > 0);
        // The memfd path only for exactly one allocation of ours: handing a
        // peer the memfd of a larger allocation would expose all of it.
        let alloc = self
            .allocs
            .iter()
            .filter_map(Weak::upgrade)
            .find(|a| a.base() == mem.addr && a.requested() as u64 == mem.len);
        let backing = match alloc {
            Some(alloc) => Backing::Memfd(alloc),
            None => Backing::CrossMemoryAttach,
        };
        let export = Export {
            generation: 0,
            secret: mem.secret,
            base: mem.addr,
            len: mem.len,
            backing,
        };
        let (slot, generation) = self
            .shared
            .exports()
            .insert(export)
            .map_err(|s| err(s, "every shm export slot is in use"))?;
        self.shared.status.set_live(slot, generation);
        Ok(Registered::Shared(DriverMemKey(
            u64::from(slot) | u64::from(generation) << 32,
        )))
    }

    pub(super) fn deregister_export(&mut self, key: DriverMemKey) {
        let (slot, generation) = (key.0 as u32, (key.0 >> 32) as u32);
        let removed = self.shared.exports().remove(slot, generation);
        let Some(export) = removed else { return };
        self.shared.status.revoke(slot);
        if matches!(export.backing, Backing::CrossMemoryAttach) {
            // A peer may be inside a cross memory attach access of it:
            // `quiesce` waits that out before the memory may be freed.
            self.revoked_cma.push(slot);
        }
    }

    /// A peer writes memfd memory through its own mapping (our pages stay
    /// alive while it maps them) but other registered memory through cross
    /// memory attach, straight into this process: a revoked export's
    /// access that already started is waited out here (bounded), and at
    /// teardown every export is revoked and waited out, before the worker
    /// frees anything. An access still running when the wait ends means
    /// the peer may yet write: the memory is leaked rather than freed.
    pub(super) fn quiesce_exports(&mut self, scope: Quiesce) -> Quiesced {
        let mut ended = true;
        match scope {
            Quiesce::Memory(key) => {
                let slot = key.0 as u32;
                if let Some(i) = self.revoked_cma.iter().position(|&s| s == slot) {
                    self.revoked_cma.swap_remove(i);
                    ended = self.wait_for_cma(slot);
                }
            }
            Quiesce::All => {
                let live: Vec<(u32, u32)> = self.shared.exports().live().collect();
                for (slot, generation) in live {
                    let export = self.shared.exports().remove(slot, generation);
                    self.shared.status.revoke(slot);
                    if export.is_some_and(|e| matches!(e.backing, Backing::CrossMemoryAttach)) {
                        self.revoked_cma.push(slot);
                    }
                }
                for slot in std::mem::take(&mut self.revoked_cma) {
                    ended &= self.wait_for_cma(slot);
                }
            }
        }
        if ended {
            Quiesced::Done
        } else {
            Quiesced::Leak
        }
    }

    pub(super) fn pack_key(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError> {
        let (slot, generation) = (key.0 as u32, (key.0 >> 32) as u32);
        let exports = self.shared.exports();
        let export = exports
            .get(slot, generation)
            .ok_or_else(|| err(Status::InvalidMemHandle, "not registered"))?;
        Ok(KeyBlob {
            path: export.path(),
            instance: self.shared.instance,
            slot,
            generation,
            secret: export.secret,
            base: export.base,
            len: export.len,
        }
        .encode())
    }

    /// Waits (bounded) until no peer runs a cross-memory-attach access with
    /// a key of `slot`; the slot is revoked already. `false` if one still
    /// ran when the wait ended: the peer may yet write the memory.
    fn wait_for_cma(&self, slot: u32) -> bool {
        let mut ended = true;
        let deadline = Instant::now() + REVOKE_WAIT;
        for channel in self.shared.inbound_snapshot().iter() {
            let Some(guard) = channel.page().word(CMA_ACTIVE_AT) else {
                continue;
            };
            let mut spins = 0u32;
            while guard.load(Ordering::SeqCst) == u64::from(slot) + 1 {
                if channel.closing.load(Ordering::Acquire) {
                    break;
                }
                if Instant::now() > deadline {
                    tracing::warn!(
                        peer = channel.peer_pid,
                        slot,
                        "a peer's access outlived deregistration's wait"
                    );
                    ended = false;
                    break;
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        ended
    }

    pub(super) fn alloc_shared(
        &mut self,
        len: usize,
        kind: MemKind,
    ) -> Option<Result<Arc<dyn DriverMemory>, DriverError>> {
        if kind != MemKind::Host {
            return None;
        }
        Some(match ShmAlloc::new(len) {
            Ok(alloc) => {
                let alloc = Arc::new(alloc);
                self.allocs.retain(|a| a.strong_count() > 0);
                self.allocs.push(Arc::downgrade(&alloc));
                Ok(alloc as Arc<dyn DriverMemory>)
            }
            Err(e) => Err(err(
                Status::NoMemory,
                format!("memfd allocation of {len} bytes: {e}"),
            )),
        })
    }
}
