//! The consumer side of an SPSC ring (see [`producer`](crate::producer) for
//! the algorithm).
//!
//! - The consumer owns `head`. It copies entries out of `head & mask` and
//!   frees their slots with one Release store of the new head per call.
//! - It knows the producer's `tail` only through `cached_tail`, reloaded with
//!   Acquire when the cache says empty. That load pairs with the producer's
//!   Release store of `tail`, so the entries' contents are visible.
//! - The shared `tail` is untrusted: `tail - head` above the capacity is
//!   [`Corrupt`]. Entries are copied out before the caller sees them, so a
//!   peer that rewrites a slot after publishing cannot change what the caller
//!   validated.
//! - When the ring is empty the consumer also reads the producer's flags: a
//!   producer that gave the ring up ([`ProducerLine::FAILED`]) publishes
//!   nothing more, so the ring is reported [`Corrupt`] instead of empty.
//!   Entries it published before stay readable first.

use crate::entry::Entry;
use crate::error::Corrupt;
use crate::layout::{ConsumerLine, ProducerLine};
use crate::raw::RawRing;
use crate::sync::{Ordering, fence};

/// Reads entries out of a ring, one or a batch at a time.
#[derive(Debug)]
pub struct Consumer<T: Entry> {
    pub(crate) ring: RawRing<T>,
    /// Next slot to read, free-running. Written only here; trusted.
    /// Invariant: `cached_tail - head <= capacity`.
    head: u32,
    /// The producer's tail as last loaded (validated). May be stale (behind
    /// the real tail), which only under-reports ready entries.
    cached_tail: u32,
}

impl<T: Entry> Consumer<T> {
    /// A consumer whose head and cached tail start at `head`.
    pub(crate) fn new(ring: RawRing<T>, head: u32) -> Self {
        Consumer {
            ring,
            head,
            cached_tail: head,
        }
    }

    /// Number of slots in the ring.
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.ring.capacity()
    }

    #[inline]
    fn ready_cached(&self) -> u32 {
        self.cached_tail.wrapping_sub(self.head)
    }

    /// Reloads the producer's tail and returns the ready count.
    #[cold]
    fn refresh_tail(&mut self) -> Result<u32, Corrupt> {
        // Acquire: makes the entries in [head, tail) visible; pairs with the
        // Release store in `Producer::submit`.
        let line = self.ring.producer_line();
        let mut tail = line.tail.load(Ordering::Acquire);
        let mut ready = tail.wrapping_sub(self.head);
        // Acquire: pairs with the Release store in `Producer::fail`. Only
        // when the ring looks empty; the word shares the tail's line.
        if ready == 0 && line.flags.load(Ordering::Acquire) & ProducerLine::FAILED != 0 {
            // Acquire, after the flag: sees every entry the producer
            // published before it gave the ring up.
            tail = line.tail.load(Ordering::Acquire);
            ready = tail.wrapping_sub(self.head);
            if ready == 0 {
                return Err(Corrupt {
                    head: self.head,
                    tail,
                    capacity: self.capacity(),
                });
            }
        }
        if ready > self.capacity() {
            return Err(Corrupt {
                head: self.head,
                tail,
                capacity: self.capacity(),
            });
        }
        self.cached_tail = tail;
        Ok(ready)
    }

    /// Gives the ring up: sets [`FAILED`](ConsumerLine::FAILED) (and clears
    /// [`NEED_WAKEUP`](ConsumerLine::NEED_WAKEUP)) in this side's flags.
    /// The producer sees it when its cached view says the ring is full and
    /// reports the ring [`Corrupt`] from then on. For a consumer that found
    /// the ring memory corrupt; it should consume nothing more.
    pub fn fail(&mut self) {
        // Release: pairs with the Acquire load in `Producer::refresh_head`.
        self.ring
            .consumer_line()
            .flags
            .store(ConsumerLine::FAILED, Ordering::Release);
    }

    /// Whether the producer gave the ring up
    /// ([`ProducerLine::FAILED`]).
    ///
    /// # Staleness
    /// The producer may set it right after this returns.
    pub fn peer_failed(&self) -> bool {
        // Acquire: pairs with the Release store in `Producer::fail`.
        self.ring.producer_line().flags.load(Ordering::Acquire) & ProducerLine::FAILED != 0
    }

    /// Checks that the head in ring memory is the one this side published
    /// last: only this side writes it, so anything else there is garbage
    /// (which the producer would read as the ring's free space). For a
    /// slow path, such as a ring found empty.
    ///
    /// # Errors
    /// [`Corrupt`] (with the head found there) if it differs.
    pub fn check_shared_head(&self) -> Result<(), Corrupt> {
        // Relaxed: this side wrote the word last, unless someone scribbled.
        let shared = self.ring.consumer_line().head.load(Ordering::Relaxed);
        if shared == self.head {
            return Ok(());
        }
        Err(Corrupt {
            head: shared,
            tail: self.cached_tail,
            capacity: self.capacity(),
        })
    }

    /// This side's flags word, less the NEED_WAKEUP bit: what a wait's
    /// store must keep ([`FAILED`](ConsumerLine::FAILED) is sticky).
    #[inline]
    fn kept_flags(&self) -> u32 {
        // Relaxed: only this side writes the word.
        self.ring.consumer_line().flags.load(Ordering::Relaxed) & ConsumerLine::FAILED
    }

    /// At least `want` ready entries, or as many as there are.
    #[inline]
    fn available(&mut self, want: u32) -> Result<u32, Corrupt> {
        let ready = self.ready_cached();
        if ready >= want {
            Ok(ready)
        } else {
            self.refresh_tail()
        }
    }

    /// Entries ready to read now (reloads the producer's tail).
    ///
    /// # Staleness
    /// The producer may publish more right after this returns; the count is
    /// a lower bound.
    ///
    /// # Errors
    /// [`Corrupt`] if the shared tail is inconsistent, or the ring is empty
    /// and the producer gave it up ([`ProducerLine::FAILED`]).
    pub fn ready(&mut self) -> Result<u32, Corrupt> {
        self.refresh_tail()
    }

    /// Frees every slot before `head` with one Release store.
    #[inline]
    fn release(&mut self, head: u32) {
        self.head = head;
        // Release: our copies of the slots before `head` are done; pairs
        // with the Acquire load of `head` in `Producer::refresh_head`.
        self.ring
            .consumer_line()
            .head
            .store(head, Ordering::Release);
    }

    /// A copy of the oldest entry, left in the ring.
    ///
    /// # Errors
    /// [`Corrupt`] if the shared tail is inconsistent, or the ring is empty
    /// and the producer gave it up ([`ProducerLine::FAILED`]).
    #[inline]
    pub fn peek(&mut self) -> Result<Option<T>, Corrupt> {
        if self.available(1)? == 0 {
            return Ok(None);
        }
        // SAFETY: `head & mask < capacity`, and the slot is published: at
        // least one entry is ready, and ready entries start at `head`.
        Ok(Some(unsafe {
            self.ring.cells.read(self.head & self.ring.mask)
        }))
    }

    /// Takes the oldest entry.
    ///
    /// # Errors
    /// [`Corrupt`] if the shared tail is inconsistent; nothing is consumed.
    #[inline]
    pub fn pop(&mut self) -> Result<Option<T>, Corrupt> {
        let entry = self.peek()?;
        if entry.is_some() {
            self.release(self.head.wrapping_add(1));
        }
        Ok(entry)
    }

    /// Takes up to `out.len()` entries, in order, freeing their slots with
    /// one store, and returns how many.
    ///
    /// # Errors
    /// [`Corrupt`] if the shared tail is inconsistent; nothing is consumed.
    #[inline]
    pub fn pop_batch(&mut self, out: &mut [T]) -> Result<usize, Corrupt> {
        let want = u32::try_from(out.len()).unwrap_or(u32::MAX);
        let n = self.available(want)?.min(want);
        if n == 0 {
            return Ok(0);
        }
        for (i, slot) in out[..n as usize].iter_mut().enumerate() {
            let index = self.head.wrapping_add(i as u32) & self.ring.mask;
            // SAFETY: `index < capacity`; slots `head..head + n` are
            // published because `n <= ready`.
            *slot = unsafe { self.ring.cells.read(index) };
        }
        self.release(self.head.wrapping_add(n));
        Ok(n as usize)
    }

    /// Announces that the consumer is about to sleep: sets `NEED_WAKEUP`,
    /// then looks once more. Returns `true` if the ring is still empty, so
    /// the caller may sleep on its doorbell (the producer will ring it);
    /// `false` if entries arrived, in which case the flag is cleared again.
    /// After waking, call [`finish_wait`](Consumer::finish_wait).
    ///
    /// See [`Producer::needs_wakeup`](crate::Producer::needs_wakeup) for why
    /// both sides need a SeqCst fence.
    ///
    /// # Errors
    /// [`Corrupt`] if the shared tail is inconsistent (the flag is cleared).
    pub fn prepare_wait(&mut self) -> Result<bool, Corrupt> {
        let kept = self.kept_flags();
        let line = self.ring.consumer_line();
        // Relaxed: the fence below orders it. Only the consumer writes flags.
        line.flags
            .store(ConsumerLine::NEED_WAKEUP | kept, Ordering::Relaxed);
        // SeqCst fence: orders the flag store before the tail load; pairs
        // with the fence in `Producer::needs_wakeup`.
        fence(Ordering::SeqCst);
        match self.refresh_tail() {
            Ok(0) => Ok(true),
            other => {
                self.finish_wait();
                other.map(|_| false)
            }
        }
    }

    /// The entries ready counted from the head in ring memory rather than
    /// this side's own: for code that took the consumer side over
    /// ([`as_raw_parts`](Consumer::as_raw_parts)) and publishes the head
    /// itself. Call it from the thread that publishes the head.
    ///
    /// # Errors
    /// [`Corrupt`] if the indices are inconsistent, or the ring is empty and
    /// the producer gave it up ([`ProducerLine::FAILED`]).
    pub fn ready_published(&self) -> Result<u32, Corrupt> {
        // Relaxed: the calling thread published the head itself.
        let head = self.ring.consumer_line().head.load(Ordering::Relaxed);
        let line = self.ring.producer_line();
        // Acquire: pairs with the Release store in `Producer::submit`.
        let mut tail = line.tail.load(Ordering::Acquire);
        // Acquire: pairs with the Release store in `Producer::fail`; then
        // the tail again, as in `refresh_tail`.
        if tail == head && line.flags.load(Ordering::Acquire) & ProducerLine::FAILED != 0 {
            tail = line.tail.load(Ordering::Acquire);
            if tail == head {
                return Err(Corrupt {
                    head,
                    tail,
                    capacity: self.capacity(),
                });
            }
        }
        let ready = tail.wrapping_sub(head);
        if ready > self.capacity() {
            return Err(Corrupt {
                head,
                tail,
                capacity: self.capacity(),
            });
        }
        Ok(ready)
    }

    /// Sets `NEED_WAKEUP` without looking at the ring: for a wait for more
    /// than one entry, whose caller puts the SeqCst fence after it and then
    /// counts the entries itself (the protocol of
    /// [`prepare_wait`](Consumer::prepare_wait)). Clear it with
    /// [`finish_wait`](Consumer::finish_wait).
    pub fn request_wakeup(&mut self) {
        let kept = self.kept_flags();
        // Relaxed: the caller's fence orders it. Only the consumer writes
        // flags.
        self.ring
            .consumer_line()
            .flags
            .store(ConsumerLine::NEED_WAKEUP | kept, Ordering::Relaxed);
    }

    /// Clears `NEED_WAKEUP` after a wait.
    pub fn finish_wait(&mut self) {
        let kept = self.kept_flags();
        // Relaxed: a stale flag costs the producer one spurious wake-up.
        self.ring
            .consumer_line()
            .flags
            .store(kept, Ordering::Relaxed);
    }

    /// Waits on `bell` until an entry is ready or `timeout` passes; returns
    /// whether one is ready. Returns at once if one already is.
    ///
    /// A ring with no entry behind it sleeps again for the time left: the
    /// producer may ring for an entry this side took without sleeping (it
    /// saw `NEED_WAKEUP` set by a wait that then found the entry), and
    /// that ring stays on the doorbell until the next wait.
    ///
    /// # Errors
    /// [`WaitError`](crate::WaitError) if the indices are corrupt or the
    /// eventfd fails.
    #[cfg(not(loom))]
    pub fn wait(
        &mut self,
        bell: &crate::Doorbell,
        timeout: Option<std::time::Duration>,
    ) -> Result<bool, crate::WaitError> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if self.available(1)? > 0 || !self.prepare_wait()? {
                return Ok(true);
            }
            let left = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                    Some(left) => Some(left),
                    None => {
                        self.finish_wait();
                        return Ok(false);
                    }
                },
            };
            let waited = bell.wait(left);
            self.finish_wait();
            waited?;
            if self.available(1)? > 0 {
                return Ok(true);
            }
        }
    }

    /// This ring's memory and this side's indices as raw pointers, for code
    /// that takes the consumer side over (the C ABI); see
    /// [`RawParts`](crate::RawParts).
    #[cfg(not(loom))]
    pub fn as_raw_parts(&self) -> crate::RawParts<T> {
        self.ring.raw_parts(self.head, self.cached_tail)
    }

    /// Whether the producer set [`OVERFLOW`](ProducerLine::OVERFLOW).
    ///
    /// # Staleness
    /// The producer may set or clear it at any time after this returns.
    #[inline]
    pub fn is_overflowed(&self) -> bool {
        // Acquire: pairs with the Release in `Producer::set_overflow`.
        self.ring.producer_line().flags.load(Ordering::Acquire) & ProducerLine::OVERFLOW != 0
    }
}
