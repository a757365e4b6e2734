//! The liveness word: a 32-bit word in the export status page that the
//! kernel itself marks when the control thread ends, however it ends.
//!
//! The control thread puts the word on its *robust futex list*
//! (`set_robust_list(2)`) and stores its thread id in it. When a thread
//! exits (returning, `SIGKILL`, a crash, `execve` in another thread), the
//! kernel walks that list before the thread's memory goes away and, for
//! every listed word still holding the thread's id, sets
//! [`OWNER_DIED`]. It does so while the process still has its
//! memory, so before the process can become a zombie and long before a
//! parent can reap it: once `waitpid` has returned for the target, every
//! peer that loads the word sees it marked. A peer reads the word from its
//! read-only mapping of the status page with one atomic load (no system
//! call), so the data path can ask at every operation.
//!
//! The list's node lives here, in private memory (a peer cannot edit it);
//! only the word is shared. The thread's previous list head (the C
//! library's, for its robust mutexes, which this thread never takes) is
//! put back before the node is freed (a null head, read as an empty list,
//! where the previous one could not be read), and the word is then marked
//! by hand,
//! so a driver dropped in a live process reads as gone too.

use std::ffi::c_long;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};

/// The bit the kernel sets in a robust futex word whose owner died (the
/// futex ABI's `FUTEX_OWNER_DIED`).
pub(crate) const OWNER_DIED: u32 = 0x4000_0000;
/// The owner's thread id bits of a futex word (`FUTEX_TID_MASK`).
pub(crate) const TID_MASK: u32 = 0x3fff_ffff;

/// What a liveness word says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Word {
    /// Never armed: the owner could not register it (`set_robust_list`
    /// refused, e.g. by a seccomp filter). It says nothing.
    Unarmed,
    /// The owning thread was running when the word was read.
    Alive,
    /// The owning thread has ended: the driver is gone, or its process.
    Gone,
}

/// Reads a liveness word (Acquire: pairs with the owner's Release of its
/// id; the kernel's mark is a locked read-modify-write).
#[inline]
pub(crate) fn read(word: &AtomicU32) -> Word {
    classify(word.load(Ordering::Acquire))
}

/// What the value `v` of a liveness word says.
#[inline]
pub(crate) fn classify(v: u32) -> Word {
    if v & OWNER_DIED != 0 {
        Word::Gone
    } else if v & TID_MASK == 0 {
        Word::Unarmed
    } else {
        Word::Alive
    }
}

/// The kernel ABI's `struct robust_list`.
#[repr(C)]
struct RobustList {
    next: *mut RobustList,
}

/// The kernel ABI's `struct robust_list_head`, followed by our one entry.
#[repr(C)]
struct Node {
    /// `list.next` points at `entry`, whose `next` points back here.
    list: RobustList,
    /// From an entry to its futex word, in bytes.
    futex_offset: c_long,
    /// Never used (no lock operation is ever in progress).
    list_op_pending: *mut RobustList,
    entry: RobustList,
}

/// The size the kernel checks in `set_robust_list`.
const HEAD_LEN: usize = std::mem::size_of::<RobustList>()
    + std::mem::size_of::<c_long>()
    + std::mem::size_of::<*mut RobustList>();

/// A liveness word armed on the calling thread; dropping it marks the word
/// gone and gives the thread back its previous list. Not `Send`: it must
/// be dropped on the thread that armed it.
#[derive(Debug)]
pub(crate) struct Armed<'a> {
    word: &'a AtomicU32,
    /// Ours, fixed in memory while the kernel holds it; `None` when the
    /// kernel refused (the word stays [`Word::Unarmed`]).
    node: Option<NonNull<Node>>,
    previous: *mut RobustList,
    previous_len: usize,
}

impl<'a> Armed<'a> {
    /// Arms `word` on the calling thread. It must live (mapped, writable by
    /// this process) until after the thread ends: the kernel writes it at
    /// exit. If the kernel refuses, the word is left 0 ([`Word::Unarmed`])
    /// and a warning is logged.
    pub(crate) fn arm(word: &'a AtomicU32) -> Armed<'a> {
        let mut previous: *mut RobustList = ptr::null_mut();
        let mut previous_len: usize = 0;
        // SAFETY: get_robust_list(0, ...) reads the calling thread's head
        // into two valid, writable locals.
        let got = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_get_robust_list,
                0 as nix::libc::c_long,
                &raw mut previous,
                &raw mut previous_len,
            )
        };
        if got != 0 {
            // Not allowed to look (a seccomp filter, say): the thread's
            // previous head is unknown. Arming goes on; `drop` then leaves
            // the kernel a null head, which it reads as an empty list (a
            // fault on a user pointer ends the walk). This thread never
            // holds the C library's robust mutexes, so nothing is lost.
            previous = ptr::null_mut();
            previous_len = HEAD_LEN;
        }
        let node = Box::into_raw(Box::new(Node {
            list: RobustList {
                next: ptr::null_mut(),
            },
            futex_offset: 0,
            list_op_pending: ptr::null_mut(),
            entry: RobustList {
                next: ptr::null_mut(),
            },
        }));
        // SAFETY: `node` is a fresh, exclusively owned allocation; the
        // pointers written are to its own fields.
        unsafe {
            let entry = &raw mut (*node).entry;
            (*node).list.next = entry;
            (*entry).next = &raw mut (*node).list;
            (*node).futex_offset =
                (word as *const AtomicU32 as isize).wrapping_sub(entry as isize) as c_long;
        }
        // The id first: the kernel marks only a word that holds it. Peers
        // read `Alive` from here on.
        let tid = nix::unistd::gettid().as_raw() as u32 & TID_MASK;
        word.store(tid, Ordering::Release);
        // SAFETY: `node` stays allocated and unmoved until `drop`, which
        // first gives the kernel back the previous head; HEAD_LEN is the
        // ABI's size of the head.
        let set = unsafe { nix::libc::syscall(nix::libc::SYS_set_robust_list, node, HEAD_LEN) };
        if set != 0 {
            let error = std::io::Error::last_os_error();
            word.store(0, Ordering::Release);
            // SAFETY: the kernel did not take the node: it is still ours.
            unsafe { drop(Box::from_raw(node)) };
            tracing::warn!(%error, "shm liveness word not armed: peers cannot tell at once when this driver dies");
            return Armed {
                word,
                node: None,
                previous,
                previous_len,
            };
        }
        Armed {
            word,
            node: NonNull::new(node),
            previous,
            previous_len,
        }
    }

    /// Whether the kernel took the word.
    #[cfg(test)]
    pub(crate) fn is_armed(&self) -> bool {
        self.node.is_some()
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        let Some(node) = self.node.take() else {
            return;
        };
        // SAFETY: restores the head saved in `arm` (the C library's, valid
        // for this thread's life, or null when it could not be read) before
        // freeing ours, so the kernel never holds a freed head. `drop` runs on the arming thread (`Armed` is
        // not `Send`: it holds raw pointers).
        unsafe {
            nix::libc::syscall(
                nix::libc::SYS_set_robust_list,
                self.previous,
                self.previous_len,
            );
            drop(Box::from_raw(node.as_ptr()));
        }
        // As the kernel would have: the driver is gone.
        self.word.fetch_or(OWNER_DIED, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn classify_reads_the_three_states() {
        assert_eq!(classify(0), Word::Unarmed);
        assert_eq!(classify(1234), Word::Alive);
        assert_eq!(classify(1234 | OWNER_DIED), Word::Gone);
        assert_eq!(classify(OWNER_DIED), Word::Gone);
        assert_eq!(classify(0x8000_0000), Word::Unarmed);
    }

    #[test]
    fn a_dropped_arm_marks_the_word_gone() {
        let word = AtomicU32::new(0);
        {
            let armed = Armed::arm(&word);
            assert!(armed.is_armed());
            assert_eq!(read(&word), Word::Alive);
        }
        assert_eq!(read(&word), Word::Gone);
    }

    #[test]
    fn the_kernel_marks_the_word_of_a_thread_that_ends_without_dropping() {
        // A thread that arms the word and ends without running the drop
        // (forgotten, as a killed thread's would be): the kernel marks it.
        let word = Arc::new(AtomicU32::new(0));
        let w = word.clone();
        std::thread::spawn(move || {
            let armed = Armed::arm(&w);
            assert!(armed.is_armed());
            assert_eq!(read(&w), Word::Alive);
            std::mem::forget(armed);
        })
        .join()
        .unwrap();
        assert_eq!(read(&word), Word::Gone);
    }
}
