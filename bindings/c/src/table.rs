//! Generation-checked handles: what C holds instead of pointers.
//!
//! A handle is a `u64`: bits 56..64 name the kind of object (so a ring
//! handle passed as a worker is refused), bits 32..56 the slot's generation,
//! bits 0..32 the slot. Removing an object bumps its slot's generation, so
//! every handle to it is stale from then on, including the one a second
//! destroy passes; a slot is reused only with its new generation. Zero is
//! never a handle (generations start at 1). A generation wraps after 2^24
//! reuses of one slot, the only way a stale handle could ever match again.
//!
//! A handle is also stale in a child of `fork()`: the child's copy of a
//! worker shares the parent's rings and connections, and using it would
//! take the parent's SQEs and talk over the parent's sockets. Every object
//! records the process's fork count when it was created (a `pthread_atfork`
//! child handler counts forks: no system call per lookup); in a child,
//! what the parent created answers `RF_ESTALE_HANDLE` to every call,
//! destroy included (the child's copy is left alone), while what the child
//! creates itself works.

use ringfence_ring::Status;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

/// Forks this process's line went through (counted in each child).
static FORKS: AtomicU32 = AtomicU32::new(0);

pub(crate) extern "C" fn count_fork_in_child() {
    // Relaxed: the child has one thread now; later loads are on it.
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The fork count, the first call registering the child handler (before
/// any object exists, so no fork can go uncounted for one).
fn forks() -> u32 {
    static WATCH: Once = Once::new();
    WATCH.call_once(crate::ffi::watch_forks);
    // Relaxed: written only in a child's single thread after fork.
    FORKS.load(Ordering::Relaxed)
}

const GENERATION_BITS: u32 = 24;
const GENERATION_MASK: u32 = (1 << GENERATION_BITS) - 1;

/// The kinds of object C holds handles to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Worker = 0x57,
    Ring = 0x52,
}

#[derive(Debug)]
struct Slot<T> {
    /// 1..=GENERATION_MASK; bumped when the value is removed.
    generation: u32,
    /// `forks()` when the value was stored.
    forks: u32,
    value: Option<T>,
}

/// Objects of one kind, by handle.
#[derive(Debug)]
pub(crate) struct Table<T> {
    kind: Kind,
    slots: Vec<Slot<T>>,
    /// Indices of empty slots.
    free: Vec<u32>,
}

impl<T> Table<T> {
    pub(crate) const fn new(kind: Kind) -> Self {
        Table {
            kind,
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    fn handle(&self, index: u32, generation: u32) -> u64 {
        u64::from(self.kind as u8) << 56 | u64::from(generation) << 32 | u64::from(index)
    }

    /// The slot index a handle names, if it is of this table's kind, and
    /// its generation.
    fn decode(&self, handle: u64) -> Result<(usize, u32), Status> {
        if handle >> 56 != u64::from(self.kind as u8) {
            return Err(Status::InvalidArgument);
        }
        let generation = (handle >> 32) as u32 & GENERATION_MASK;
        if generation == 0 {
            return Err(Status::InvalidArgument);
        }
        Ok((handle as u32 as usize, generation))
    }

    /// Stores `value`; returns its handle.
    ///
    /// # Errors
    /// [`Status::NoResource`] if 2^32 objects exist.
    pub(crate) fn insert(&mut self, value: T) -> Result<u64, Status> {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = u32::try_from(self.slots.len()).map_err(|_| Status::NoResource)?;
                self.slots.push(Slot {
                    generation: 1,
                    forks: 0,
                    value: None,
                });
                index
            }
        };
        let slot = &mut self.slots[index as usize];
        debug_assert!(slot.value.is_none());
        slot.value = Some(value);
        slot.forks = forks();
        let generation = slot.generation;
        Ok(self.handle(index, generation))
    }

    /// The live object `handle` names.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for zero or a handle of another kind,
    /// [`Status::StaleHandle`] for one whose object was removed (or that
    /// never existed), or was created before this process forked.
    pub(crate) fn get(&self, handle: u64) -> Result<&T, Status> {
        let (index, generation) = self.decode(handle)?;
        match self.slots.get(index) {
            Some(Slot {
                generation: g,
                forks,
                value: Some(value),
            }) if *g == generation && *forks == FORKS.load(Ordering::Relaxed) => Ok(value),
            _ => Err(Status::StaleHandle),
        }
    }

    /// As [`get`](Table::get), mutably.
    ///
    /// # Errors
    /// As `get`.
    pub(crate) fn get_mut(&mut self, handle: u64) -> Result<&mut T, Status> {
        let (index, generation) = self.decode(handle)?;
        match self.slots.get_mut(index) {
            Some(Slot {
                generation: g,
                forks,
                value: Some(value),
            }) if *g == generation && *forks == FORKS.load(Ordering::Relaxed) => Ok(value),
            _ => Err(Status::StaleHandle),
        }
    }

    /// Takes the object out; every handle to it is stale from now on.
    ///
    /// # Errors
    /// As [`get`](Table::get).
    pub(crate) fn remove(&mut self, handle: u64) -> Result<T, Status> {
        self.get(handle)?;
        let (index, _) = self.decode(handle)?;
        let slot = &mut self.slots[index];
        slot.generation = if slot.generation == GENERATION_MASK {
            1
        } else {
            slot.generation + 1
        };
        self.free.push(index as u32);
        slot.value.take().ok_or(Status::StaleHandle)
    }

    /// Every live object.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.value.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_go_stale_on_removal_and_slots_are_reused_with_a_new_generation() {
        let mut t = Table::new(Kind::Worker);
        let a = t.insert("a").unwrap();
        let b = t.insert("b").unwrap();
        assert_ne!(a, 0);
        assert_eq!((t.get(a), t.get(b)), (Ok(&"a"), Ok(&"b")));
        assert_eq!(t.remove(a), Ok("a"));
        assert_eq!(t.get(a), Err(Status::StaleHandle));
        assert_eq!(t.remove(a), Err(Status::StaleHandle), "double removal");
        let c = t.insert("c").unwrap();
        assert_eq!(c as u32, a as u32, "the slot is reused");
        assert_ne!(c, a, "with a new generation");
        assert_eq!(t.get(a), Err(Status::StaleHandle));
        *t.get_mut(c).unwrap() = "c2";
        assert_eq!(t.get(c), Ok(&"c2"));
        assert_eq!(t.values().count(), 2);
    }

    #[test]
    fn foreign_and_forged_handles_are_refused() {
        let mut workers = Table::new(Kind::Worker);
        let mut rings = Table::new(Kind::Ring);
        let w = workers.insert(1).unwrap();
        let r = rings.insert(2).unwrap();
        assert_eq!(rings.get(w), Err(Status::InvalidArgument), "wrong kind");
        assert_eq!(workers.get(r), Err(Status::InvalidArgument));
        assert_eq!(workers.get(0), Err(Status::InvalidArgument));
        assert_eq!(workers.get(u64::MAX), Err(Status::InvalidArgument));
        // Right kind, generation 0 (never handed out).
        assert_eq!(
            workers.get(w & !(0xff_ffff << 32)),
            Err(Status::InvalidArgument)
        );
        // Right kind and generation, a slot that does not exist.
        assert_eq!(workers.get(w + 7), Err(Status::StaleHandle));
        assert_eq!(workers.remove(w + 7), Err(Status::StaleHandle));
    }

    #[test]
    fn generations_wrap_past_zero() {
        let mut t = Table::new(Kind::Ring);
        t.insert(()).unwrap();
        t.slots[0].generation = GENERATION_MASK;
        let h = t.handle(0, GENERATION_MASK);
        t.remove(h).unwrap();
        assert_eq!(t.slots[0].generation, 1);
        let again = t.insert(()).unwrap();
        assert_eq!(t.get(again), Ok(&()));
        assert_eq!(t.get(h), Err(Status::StaleHandle));
    }
}
