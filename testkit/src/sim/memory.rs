//! Memory the driver hands out ([`SimMemory`]) and the slow first phase
//! of registrations ([`SlowPrepare`]).

use ringfence::DriverMemory;
use ringfence::MemKind;
use ringfence::{DriverEp, DriverError, KeyPart, MemDesc, Prepare, Prepared};
use ringfence_ring::Status;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

// SAFETY: `SimMemory` owns its allocation and hands out only its address;
// the bytes are accessed through raw copies and atomics by whoever
// registered them, never through this object.
#[allow(unsafe_code)]
unsafe impl Send for SimMemory {}
// SAFETY: as above; `&SimMemory` gives out only the address and length.
#[allow(unsafe_code)]
unsafe impl Sync for SimMemory {}

impl SimMemory {
    /// `len` zeroed bytes (at least one), 64-byte aligned; `None` if the
    /// allocation fails.
    #[allow(unsafe_code)]
    pub(super) fn new(len: usize, kind: MemKind, state: Arc<Mutex<State>>) -> Option<SimMemory> {
        let layout = Layout::from_size_align(len.max(1), 64).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(SimMemory {
            ptr,
            layout,
            len: len.max(1),
            kind,
            state,
        })
    }
}

// SAFETY: the allocation is `len` bytes from `alloc_zeroed` (zeroed, mapped,
// readable and writable host memory), 64-byte aligned by its layout, and
// lives, unmoved, until this object drops; `kind` is the kind asked for.
// For a claimed device kind the bytes are host memory all the same.
#[allow(unsafe_code)]
unsafe impl DriverMemory for SimMemory {
    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemKind {
        self.kind
    }
}

impl Drop for SimMemory {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        let (addr, len) = (self.addr(), self.len);
        // SAFETY: allocated in `new` with exactly this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
        let mut s = lock(&self.state);
        s.freed.push((addr, len as u64));
        s.events.push(SimEvent::Freed { addr, len });
    }
}

impl SlowPrepare {
    /// Waits until the engine has polled the driver as many more times
    /// as programmed.
    pub(super) fn wait(&self, register: bool) -> Result<(), DriverError> {
        let (start, wanted) = {
            let s = lock(&self.state);
            (s.stats.polls, s.slow_polls)
        };
        if wanted == 0 {
            return Ok(());
        }
        let polls = || lock(&self.state).stats.polls;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while polls() - start < wanted {
            if std::time::Instant::now() > deadline {
                return Err(DriverError::new(
                    Status::Timeout,
                    "the engine did not poll while a registration's first phase ran",
                ));
            }
            std::thread::yield_now();
        }
        let polls = polls() - start;
        lock(&self.state)
            .events
            .push(SimEvent::Prepared { register, polls });
        Ok(())
    }
}

impl Prepare for SlowPrepare {
    fn register(&self, mem: &MemDesc) -> Result<Prepared, DriverError> {
        let inner = match &self.inner {
            Some(p) => p.register(mem)?,
            None => Prepared::none(),
        };
        self.wait(true)?;
        Ok(Prepared::new(SlowDone(inner)))
    }

    fn unpack(&self, ep: DriverEp, part: &KeyPart<'_>) -> Result<Prepared, DriverError> {
        let inner = match &self.inner {
            Some(p) => p.unpack(ep, part)?,
            None => Prepared::none(),
        };
        self.wait(false)?;
        Ok(Prepared::new(SlowDone(inner)))
    }
}
