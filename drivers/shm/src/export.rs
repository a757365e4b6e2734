//! The target's side of registration: the export table (what a peer may
//! map, checked by the control thread when a peer presents a key) and the
//! export status page (one word per slot that peers check before every
//! access, so a deregistered export is refused from then on).

use crate::layout::{EXPORT_SLOTS, LINE, liveness_at, status_page_len};
use crate::memfd;
use crate::sys::alloc::ShmAlloc;
use crate::sys::region::SharedRegion;
use crate::wire::KeyPath;
use nix::fcntl::SealFlag;
use ringfence_ring::Status;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// What backs an export.
#[derive(Debug, Clone)]
pub(crate) enum Backing {
    /// Exactly one allocation of this driver: the peer maps its memfd.
    Memfd(Arc<ShmAlloc>),
    /// Other memory of this process: the peer uses cross memory attach.
    CrossMemoryAttach,
}

/// One exported registration.
#[derive(Debug, Clone)]
pub(crate) struct Export {
    /// Bumped every time the slot is reused; never 0 for a live export.
    pub generation: u32,
    /// The random secret a key must present.
    pub secret: u64,
    /// Start address in this process.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    pub backing: Backing,
}

impl Export {
    pub(crate) fn path(&self) -> KeyPath {
        match self.backing {
            Backing::Memfd(_) => KeyPath::Memfd,
            Backing::CrossMemoryAttach => KeyPath::CrossMemoryAttach,
        }
    }
}

/// Exports by slot.
#[derive(Debug, Default)]
pub(crate) struct ExportTable {
    slots: Vec<Option<Export>>,
    /// The last generation used in each slot.
    generations: Vec<u32>,
}

impl ExportTable {
    /// Adds an export (its `generation` is assigned here); returns its slot
    /// and generation.
    ///
    /// # Errors
    /// [`Status::NoResource`] when every slot is taken.
    pub(crate) fn insert(&mut self, mut export: Export) -> Result<(u32, u32), Status> {
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(slot) => slot,
            None if self.slots.len() < EXPORT_SLOTS as usize => {
                self.slots.push(None);
                self.generations.push(0);
                self.slots.len() - 1
            }
            None => return Err(Status::NoResource),
        };
        let generation = match self.generations[slot].wrapping_add(1) {
            0 => 1,
            g => g,
        };
        self.generations[slot] = generation;
        export.generation = generation;
        self.slots[slot] = Some(export);
        Ok((slot as u32, generation))
    }

    /// The live export in `slot` with `generation`.
    pub(crate) fn get(&self, slot: u32, generation: u32) -> Option<&Export> {
        self.slots
            .get(slot as usize)?
            .as_ref()
            .filter(|e| e.generation == generation)
    }

    /// Removes the export in `slot` with `generation`.
    pub(crate) fn remove(&mut self, slot: u32, generation: u32) -> Option<Export> {
        self.get(slot, generation)?;
        self.slots.get_mut(slot as usize)?.take()
    }

    /// Every live (slot, generation).
    pub(crate) fn live(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, e)| Some((slot as u32, e.as_ref()?.generation)))
    }
}

/// The export status page (see `layout`).
#[derive(Debug)]
pub(crate) struct StatusPage {
    map: SharedRegion,
    fd: OwnedFd,
}

impl StatusPage {
    /// A new page, every slot not live. Sealed against resizing and
    /// against any new writable mapping (`F_SEAL_FUTURE_WRITE`): peers can
    /// only read it.
    ///
    /// # Errors
    /// A system call failed.
    pub(crate) fn new() -> io::Result<StatusPage> {
        let len = status_page_len(EXPORT_SLOTS);
        let fd = memfd::create("ringfence-shm-exports", len)?;
        let map = SharedRegion::map(fd.as_fd(), 0, len as usize, true)?;
        memfd::seal(
            fd.as_fd(),
            memfd::RESIZE_SEALS.union(SealFlag::F_SEAL_FUTURE_WRITE),
        )
        .or_else(|_| memfd::seal(fd.as_fd(), memfd::RESIZE_SEALS))?;
        Ok(StatusPage { map, fd })
    }

    /// The memfd, for peers.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn word(&self, slot: u32) -> Option<&AtomicU64> {
        // Only slot words: the liveness word follows them.
        (slot < EXPORT_SLOTS).then(|| self.map.word(slot as usize * 8))?
    }

    /// This driver's liveness word (see `layout` and `sys::robust`).
    pub(crate) fn liveness(&self) -> &AtomicU32 {
        self.map
            .word32(liveness_at(EXPORT_SLOTS) as usize)
            .expect("the status page holds its liveness word")
    }

    /// Marks `slot` live with `generation`. Release: the export's table
    /// entry (under the table lock) is in place before a peer sees it live.
    pub(crate) fn set_live(&self, slot: u32, generation: u32) {
        if let Some(w) = self.word(slot) {
            w.store(u64::from(generation), Ordering::Release);
        }
    }

    /// Marks `slot` not live. SeqCst: in a Dekker pair with the
    /// initiator's SeqCst store of `cma_active` before its SeqCst load of
    /// this word (see `layout`).
    pub(crate) fn revoke(&self, slot: u32) {
        if let Some(w) = self.word(slot) {
            w.store(0, Ordering::SeqCst);
        }
    }
}

/// Whether the status word of `slot` in a peer's status page says
/// `generation` is live. `order` is Acquire for mapped access and SeqCst
/// around cross memory attach (see `layout`).
pub(crate) fn is_live(page: &SharedRegion, slot: u32, generation: u32, order: Ordering) -> bool {
    // Only slot words, never the liveness line after them.
    let slots = (page.len() as u64).saturating_sub(LINE as u64) / 8;
    (u64::from(slot) < slots)
        .then(|| page.word(slot as usize * 8))
        .flatten()
        .is_some_and(|w| w.load(order) == u64::from(generation))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export() -> Export {
        Export {
            generation: 0,
            secret: 1,
            base: 0x1000,
            len: 8,
            backing: Backing::CrossMemoryAttach,
        }
    }

    #[test]
    fn slots_are_reused_with_new_generations() {
        let mut t = ExportTable::default();
        let (a, ga) = t.insert(export()).unwrap();
        let (b, _) = t.insert(export()).unwrap();
        assert_ne!(a, b);
        assert!(t.get(a, ga).is_some());
        assert!(t.get(a, ga + 1).is_none());
        assert!(
            t.remove(a, ga + 1).is_none(),
            "wrong generation removes nothing"
        );
        assert!(t.remove(a, ga).is_some());
        assert!(t.get(a, ga).is_none());
        let (c, gc) = t.insert(export()).unwrap();
        assert_eq!(c, a);
        assert_ne!(gc, ga);
        assert_eq!(t.live().count(), 2);
        assert!(t.get(EXPORT_SLOTS + 5, 1).is_none());
    }

    #[test]
    fn the_status_page_is_read_only_for_peers() {
        let page = StatusPage::new().unwrap();
        page.set_live(3, 9);
        let len = status_page_len(EXPORT_SLOTS) as usize;
        let peer = SharedRegion::map(page.fd(), 0, len, false).unwrap();
        assert!(is_live(&peer, 3, 9, Ordering::Acquire));
        // The liveness word is not a slot, whatever it holds.
        page.liveness().store(7, Ordering::Release);
        let at = liveness_at(EXPORT_SLOTS) as usize;
        assert_eq!(peer.word32(at).unwrap().load(Ordering::Acquire), 7);
        assert!(!is_live(&peer, EXPORT_SLOTS, 7, Ordering::Acquire));
        assert!(!is_live(&peer, EXPORT_SLOTS + 1, 0, Ordering::Acquire));
        assert!(!is_live(&peer, 3, 8, Ordering::Acquire));
        assert!(
            !is_live(&peer, EXPORT_SLOTS, 0, Ordering::Acquire),
            "out of range"
        );
        page.revoke(3);
        assert!(!is_live(&peer, 3, 9, Ordering::SeqCst));
        assert!(
            SharedRegion::map(page.fd(), 0, 4096, true).is_err(),
            "F_SEAL_FUTURE_WRITE refuses writable mappings"
        );
    }
}
