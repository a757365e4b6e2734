//! The driver's io_uring: submission, completion, the CQ eventfd, and the
//! provided-buffer ring that multishot receives fill.
//!
//! Everything that hands the kernel a pointer is here or in
//! [`send`](crate::send), and says why the memory outlives the request.

use io_uring::{IoUring, cqueue, squeue, types};
use memmap2::MmapMut;
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

/// What a completion belongs to: the top byte of its `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Tag {
    /// The listener's multishot accept.
    Accept = 1,
    /// A lane's connect.
    Connect = 2,
    /// A connection's send.
    Send = 3,
    /// A connection's multishot receive.
    Recv = 4,
    /// A cancellation (its result is not needed).
    Cancel = 5,
    /// A receive straight into registered memory (a large PUT's payload).
    Direct = 6,
}

/// `user_data` for `tag` on connection `slot` of generation `generation`.
pub(crate) fn user_data(tag: Tag, slot: u32, generation: u32) -> u64 {
    (tag as u64) << 56 | u64::from(slot & 0x00ff_ffff) << 32 | u64::from(generation)
}

/// The parts of a `user_data`; `None` for a tag this driver never sets.
pub(crate) fn parse_user_data(data: u64) -> Option<(Tag, u32, u32)> {
    let tag = match (data >> 56) as u8 {
        1 => Tag::Accept,
        2 => Tag::Connect,
        3 => Tag::Send,
        4 => Tag::Recv,
        5 => Tag::Cancel,
        6 => Tag::Direct,
        _ => return None,
    };
    Some((tag, (data >> 32) as u32 & 0x00ff_ffff, data as u32))
}

/// The buffer group of the provided-buffer ring.
pub(crate) const BUF_GROUP: u16 = 0;

/// Receive buffers the kernel picks from for multishot receives: `count`
/// buffers of `size` bytes, and the ring that offers them to the kernel.
struct BufRing {
    /// `count` entries of 16 bytes; the kernel reads it, we write it.
    ring: MmapMut,
    /// The buffers, `count * size` bytes.
    buffers: MmapMut,
    count: u16,
    size: u32,
    /// Our copy of the ring's tail.
    tail: u16,
}

impl BufRing {
    fn new(count: u16, size: u32) -> io::Result<BufRing> {
        assert!(
            count.is_power_of_two(),
            "buffer count must be a power of two"
        );
        let ring = MmapMut::map_anon(usize::from(count) * size_of::<types::BufRingEntry>())?;
        let buffers = MmapMut::map_anon(usize::from(count) * size as usize)?;
        let mut r = BufRing {
            ring,
            buffers,
            count,
            size,
            tail: 0,
        };
        for bid in 0..count {
            r.offer(bid);
        }
        r.publish();
        Ok(r)
    }

    fn entries(&mut self) -> *mut types::BufRingEntry {
        self.ring.as_mut_ptr().cast()
    }

    /// Puts buffer `bid` at the tail (not yet visible to the kernel).
    fn offer(&mut self, bid: u16) {
        let index = usize::from(self.tail & (self.count - 1));
        let addr = self.buffers.as_ptr() as u64 + u64::from(bid) * u64::from(self.size);
        // SAFETY: `index < count`: the entry lies inside the ring mapping,
        // which is 16-byte aligned (page aligned). The kernel reads entries
        // only between its head and the published tail, and this one is past
        // the published tail until `publish`.
        let entry = unsafe { &mut *self.entries().add(index) };
        entry.set_addr(addr);
        entry.set_len(self.size);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes every offered buffer visible to the kernel.
    fn publish(&mut self) {
        // SAFETY: the tail field overlays the reserved field of entry 0,
        // inside the mapping, 2-byte aligned; the kernel reads it
        // concurrently, so it is written atomically (Release: the entries
        // written before are visible first).
        let tail = unsafe { &*types::BufRingEntry::tail(self.entries()).cast::<AtomicU16>() };
        tail.store(self.tail, Ordering::Release);
    }

    /// Buffer `bid`'s first `len` bytes.
    fn get(&self, bid: u16, len: usize) -> Option<&[u8]> {
        if bid >= self.count || len > self.size as usize {
            return None;
        }
        let start = usize::from(bid) * self.size as usize;
        self.buffers.get(start..start + len)
    }
}

/// Entries of the fixed-file table: connection slots below this get one.
const FIXED_FILES: u32 = 1024;

/// The ring, its eventfd and its receive buffers.
pub(crate) struct Uring {
    // Dropped first: the kernel lets go of the buffers before they are
    // unmapped (and the driver's `Drop` waits for requests in flight).
    ring: IoUring,
    bufs: BufRing,
    /// Written by the kernel for every completion it posts; read only by
    /// [`prepare_sleep`](Uring::prepare_sleep).
    eventfd: EventFd,
    /// Entries of the ring's fixed-file table (0: the kernel refused it).
    fixed_files: u32,
    /// Receive buffers taken while their bytes were borrowed, to give
    /// back at once ([`Uring::recycle_taken`]).
    taken: Vec<u16>,
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
        // lives as long as `bufs`, which outlives `ring` (field order, and
        // the driver waits for every request before dropping either).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.ring.as_ptr() as u64,
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
            ring,
            bufs,
            eventfd,
            fixed_files,
            taken: Vec::with_capacity(usize::from(buffers)),
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

    /// Queues `entry`; submits first if the SQ is full.
    ///
    /// # Safety
    /// Every buffer, address and iovec the entry names stays valid until
    /// its completion (its last one, for multishot requests) is taken.
    pub(crate) unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
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
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc_errno::EAGAIN | libc_errno::EBUSY)
                ) =>
            {
                Ok(())
            }
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
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc_errno::ETIME | libc_errno::EINTR)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The next completion, if any. Runs waiting task work first (one
    /// `io_uring_enter`) when the CQ looks empty and the kernel flagged
    /// some (see `new`). Never touches the eventfd: while the core thread
    /// polls, the kernel's writes just accumulate, and no `read(2)` comes
    /// between an answer and the application.
    pub(crate) fn next(&mut self) -> Option<cqueue::Entry> {
        let cqe = self.ring.completion().next();
        if cqe.is_some() || !self.ring.submission().taskrun() {
            return cqe;
        }
        // Task work is waiting: any `io_uring_enter` runs it and posts its
        // completions. An error leaves it for the next round.
        let _ = self.ring.submit();
        self.ring.completion().next()
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
}

/// The errno values the driver tells apart.
pub(crate) mod libc_errno {
    pub(crate) use nix::libc::{EAGAIN, EBUSY, ECANCELED, EINTR, ENOBUFS, ETIME};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips() {
        for (tag, slot, generation) in [
            (Tag::Accept, 0, 0),
            (Tag::Send, 0x00ff_ffff, u32::MAX),
            (Tag::Recv, 12, 7),
            (Tag::Cancel, 1, 1),
            (Tag::Connect, 99, 3),
            (Tag::Direct, 5, 9),
        ] {
            assert_eq!(
                parse_user_data(user_data(tag, slot, generation)),
                Some((tag, slot, generation))
            );
        }
        assert_eq!(parse_user_data(0), None);
        assert_eq!(parse_user_data(u64::MAX), None);
    }

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
