//! The driver's io_uring: setup, submission, completion, the CQ eventfd,
//! the fixed-file table, and the provided-buffer ring that buffer
//! receives fill ([`BufRing`]). The requests themselves are built in
//! [`requests`](super::requests), each saying why the memory it names
//! outlives it.

use super::bufring::{BUF_GROUP, BufRing};
use super::requests::Cqe;
use io_uring::{IoUring, squeue, types};
use nix::libc::{EAGAIN, EBUSY, EINTR, ETIME};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

/// Entries of the fixed-file table: connection slots below this get one.
const FIXED_FILES: u32 = 1024;

/// The ring, its eventfd and its receive buffers.
///
/// Dropped only once the kernel holds no request (the driver's `Drop`
/// waits for a teardown that ends), or never ([`Uring::leak`]): a
/// request in flight may still write into the receive buffers or a
/// window, or read a send batch.
pub(crate) struct Uring {
    /// Dropped first (by hand, in `Drop`): the kernel lets go of the
    /// buffers before they are unmapped.
    ring: ManuallyDrop<IoUring>,
    bufs: ManuallyDrop<BufRing>,
    /// Written by the kernel for every completion it posts; read only by
    /// [`prepare_sleep`](Uring::prepare_sleep).
    eventfd: EventFd,
    /// Entries of the ring's fixed-file table (0: the kernel refused it).
    fixed_files: u32,
    /// Receive buffers taken while their bytes were borrowed, to give
    /// back at once ([`Uring::recycle_taken`]).
    taken: Vec<u16>,
    /// Never drop the ring or the buffers ([`Uring::leak`]).
    leaked: bool,
}

impl Drop for Uring {
    fn drop(&mut self) {
        if self.leaked {
            return;
        }
        // SAFETY: each is dropped once, here, and not used after; the ring
        // first, so that the kernel lets go of the buffers before they are
        // unmapped.
        unsafe {
            ManuallyDrop::drop(&mut self.ring);
            ManuallyDrop::drop(&mut self.bufs);
        }
    }
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring")
            .field("entries", &self.ring.params().sq_entries())
            .field("buffers", &self.bufs.count)
            .field("buffer_size", &self.bufs.size)
            .finish_non_exhaustive()
    }
}

impl Uring {
    /// A ring of `entries` SQEs (completions up to 4×) with `buffers`
    /// receive buffers of `buffer_size` bytes.
    pub(crate) fn new(entries: u32, buffers: u16, buffer_size: u32) -> io::Result<Uring> {
        // Cooperative task running: the kernel finishes a receive (or an
        // accept, a send's retry) in the submitting thread's task work.
        // By default it interrupts that thread with an IPI to run it; on
        // a busy-polling thread in a VM that IPI cost more than half of an
        // 8-byte PUT's one-way latency (29 µs against 12 µs with this,
        // `cargo bench --bench tcp -- put_lat`). Here the kernel only sets
        // IORING_SQ_TASKRUN, which `next` checks and answers with one
        // `io_uring_enter`; a thread asleep (the core thread in epoll) is
        // still woken. A thread that submitted and then spins in user space
        // without progressing runs the work at its next kernel entry or
        // interrupt (a scheduler tick at most). Kernels before 5.19 lack
        // the flags: the default is kept there.
        let ring = IoUring::builder()
            .setup_cqsize(entries * 4)
            .setup_submit_all()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(entries)
            .or_else(|_| {
                IoUring::builder()
                    .setup_cqsize(entries * 4)
                    .setup_submit_all()
                    .build(entries)
            })?;
        let bufs = BufRing::new(buffers, buffer_size)?;
        // SAFETY: the ring memory is `count` entries, page aligned, and
        // lives as long as `bufs`, which outlives `ring` (`Drop`, and the
        // driver waits for every request before dropping either).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.ring_addr(),
                bufs.count,
                BUF_GROUP,
                0,
            )?;
        }
        let eventfd =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(io::Error::from)?;
        ring.submitter()
            .register_eventfd(eventfd.as_fd().as_raw_fd())?;
        // A fixed-file table for the connections' sockets: requests on a
        // fixed file skip the lookup and reference count of their
        // descriptor (`fget`/`fput`, 3% of the CPU time of an 8-byte PUT
        // ping-pong). Without it, descriptors are used.
        let fixed_files = match ring.submitter().register_files_sparse(FIXED_FILES) {
            Ok(()) => FIXED_FILES,
            Err(_) => 0,
        };
        Ok(Uring {
            ring: ManuallyDrop::new(ring),
            bufs: ManuallyDrop::new(bufs),
            eventfd,
            fixed_files,
            taken: Vec::with_capacity(usize::from(buffers)),
            leaked: false,
        })
    }

    /// Enters `fd` in the fixed-file table at `index` (a connection's
    /// slot); the index to name it by, or `None` (no table, an index past
    /// it, a refusal): then requests name the descriptor. Control path.
    pub(crate) fn fix(&mut self, index: u32, fd: RawFd) -> Option<u32> {
        if index >= self.fixed_files {
            return None;
        }
        match self.ring.submitter().register_files_update(index, &[fd]) {
            Ok(1) => Some(index),
            _ => None,
        }
    }

    /// Empties fixed-file entry `index` once no request in flight names
    /// it: the table holds a reference, which would keep the socket open
    /// after its descriptor is closed.
    pub(crate) fn unfix(&mut self, index: u32) {
        if let Err(e) = self.ring.submitter().register_files_update(index, &[-1]) {
            tracing::warn!(%e, index, "tcp: a fixed file could not be removed");
        }
    }

    /// The CQ eventfd: readable once a completion was posted since the
    /// last [`prepare_sleep`](Uring::prepare_sleep).
    pub(crate) fn eventfd(&self) -> BorrowedFd<'_> {
        self.eventfd.as_fd()
    }

    /// Queues `entry`; submits first if the SQ is full. Only for the
    /// request builders of `sys` ([`requests`](super::requests)).
    ///
    /// # Safety
    /// Every buffer, address and iovec the entry names stays valid until
    /// its completion (its last one, for multishot requests) is taken.
    pub(super) unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: the caller's contract.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    /// Submits what is queued: one `io_uring_enter`, none if nothing is.
    pub(crate) fn submit(&mut self) -> io::Result<()> {
        if self.ring.submission().is_empty() {
            return Ok(());
        }
        match self.ring.submit() {
            Ok(_) => Ok(()),
            // The kernel is short of memory for completions or is busy:
            // what was not taken stays queued for the next round.
            Err(e) if matches!(e.raw_os_error(), Some(EAGAIN | EBUSY)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Submits and waits for one completion, or for `timeout` (neither the
    /// timeout nor a signal is an error).
    pub(crate) fn submit_and_wait_for(&mut self, timeout: Duration) -> io::Result<()> {
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(ETIME | EINTR)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The next completion, if any. Runs waiting task work first (one
    /// `io_uring_enter`) when the CQ looks empty and the kernel flagged
    /// some (see `new`). Never touches the eventfd: while the core thread
    /// polls, the kernel's writes just accumulate, and no `read(2)` comes
    /// between an answer and the application.
    pub(crate) fn next(&mut self) -> Option<Cqe> {
        let cqe = self.ring.completion().next();
        if cqe.is_some() || !self.ring.submission().taskrun() {
            return cqe.map(Cqe::new);
        }
        // Task work is waiting: any `io_uring_enter` runs it and posts its
        // completions. An error leaves it for the next round.
        let _ = self.ring.submit();
        self.ring.completion().next().map(Cqe::new)
    }

    /// Arms the eventfd for a sleeper ([`Driver::prepare_sleep`](ringfence::Driver::prepare_sleep)):
    /// reads it to zero, then looks at the CQ and the task-work flag once
    /// more. `true`: nothing is waiting, and any completion posted from
    /// now on writes the eventfd, which stays readable until the next
    /// call. `false`: something arrived (a completion posted before the
    /// read, whose write the read took, or task work to run): the caller
    /// stays up and takes it.
    pub(crate) fn prepare_sleep(&mut self) -> bool {
        // EAGAIN (nothing written since the last read) is the common case.
        let _ = self.eventfd.read();
        let empty = self.ring.completion().is_empty();
        empty && !self.ring.submission().taskrun()
    }

    /// Receive buffer `bid`'s first `len` bytes (what a receive completion
    /// said it wrote).
    pub(crate) fn buffer(&self, bid: u16, len: usize) -> Option<&[u8]> {
        self.bufs.get(bid, len)
    }

    /// Gives receive buffers back to the kernel.
    pub(crate) fn recycle(&mut self, bids: impl IntoIterator<Item = u16>) {
        let mut any = false;
        for bid in bids {
            if bid < self.bufs.count {
                self.bufs.offer(bid);
                any = true;
            }
        }
        if any {
            self.bufs.publish();
        }
    }

    /// Buffer `bid` was read to the end: given back to the kernel at the
    /// next [`recycle_taken`](Uring::recycle_taken), with the others taken
    /// since (one publication for all).
    pub(crate) fn recycle_later(&mut self, bid: u16) {
        self.taken.push(bid);
    }

    /// Gives back the buffers [`recycle_later`](Uring::recycle_later) set
    /// aside.
    pub(crate) fn recycle_taken(&mut self) {
        let mut taken = std::mem::take(&mut self.taken);
        self.recycle(taken.drain(..));
        self.taken = taken;
    }

    /// Receive buffers.
    pub(crate) fn buffer_count(&self) -> u16 {
        self.bufs.count
    }

    /// Never unmaps the receive buffers or closes the ring, not even when
    /// dropped: requests still in flight may write into them (a teardown
    /// that leaks).
    pub(crate) fn leak(&mut self) {
        self.leaked = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The eventfd's count, and the eventfd read to zero.
    fn drain(u: &Uring) -> u64 {
        u.eventfd.read().unwrap_or(0)
    }

    fn nop(u: &mut Uring) {
        let nop = io_uring::opcode::Nop::new().build().user_data(7);
        // SAFETY: a NOP names no memory.
        unsafe { u.push(&nop) }.unwrap();
        u.submit().unwrap();
    }

    #[test]
    fn the_eventfd_is_read_only_when_arming_for_sleep() {
        let mut u = Uring::new(8, 2, 4096).unwrap();
        assert!(u.prepare_sleep(), "an idle ring is ready to sleep");
        assert_eq!(drain(&u), 0, "arming read the eventfd to zero");
        // A completion posted after arming writes it, and polling does
        // not read it: the sleeper is woken, whoever polls first.
        nop(&mut u);
        assert_eq!(u.next().map(|c| c.user_data()), Some(7));
        for _ in 0..256 {
            assert!(u.next().is_none());
        }
        assert_eq!(drain(&u), 1, "polling read the eventfd");
        // A completion posted before arming and not taken yet: its write
        // goes with the read, so arming says not now.
        nop(&mut u);
        assert!(!u.prepare_sleep(), "armed over a waiting completion");
        assert_eq!(drain(&u), 0);
        assert_eq!(u.next().map(|c| c.user_data()), Some(7));
        assert!(u.prepare_sleep());
    }
}
