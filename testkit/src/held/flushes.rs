//! The held flushes: in the order they were started, each released only
//! once it is due and the operations it covers have left their lanes.

use super::{HeldFlush, HeldLanes, Moment};
use ringfence::DriverEp;
use std::collections::VecDeque;

/// Held flushes, oldest first.
#[derive(Debug)]
pub(crate) struct HeldFlushes<M> {
    queue: VecDeque<HeldFlush<M>>,
}

impl<M: Copy> HeldFlushes<M> {
    /// None held.
    pub(crate) fn new() -> HeldFlushes<M> {
        HeldFlushes {
            queue: VecDeque::new(),
        }
    }

    /// How many are held.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Holds `flush`, behind the others.
    pub(crate) fn push(&mut self, flush: HeldFlush<M>) {
        self.queue.push_back(flush);
    }

    /// Every held flush, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &HeldFlush<M>> {
        self.queue.iter()
    }

    /// Whether one is held on `ep`.
    pub(crate) fn any_on(&self, ep: DriverEp) -> bool {
        self.queue.iter().any(|f| f.ep == ep)
    }

    /// The index of the first flush from `from` on that may go at `at`: it
    /// is due, and `lanes` holds nothing posted before it on the lanes it
    /// covers.
    pub(crate) fn next_ready<O: Copy>(
        &self,
        from: usize,
        lanes: &HeldLanes<O>,
        at: Moment,
    ) -> Option<usize> {
        (from..self.queue.len()).find(|&i| {
            let f = &self.queue[i];
            f.is_due(at) && !lanes.holds_before(f.ep, f.lanes, f.seq)
        })
    }

    /// The flush at `index`.
    pub(crate) fn get(&self, index: usize) -> HeldFlush<M> {
        self.queue[index]
    }

    /// Takes the flush at `index` out.
    ///
    /// # Panics
    /// If there is none there.
    pub(crate) fn remove(&mut self, index: usize) -> HeldFlush<M> {
        self.queue
            .remove(index)
            .expect("a held flush at that index")
    }

    /// Takes out the flushes for which `take` holds, in order.
    pub(crate) fn take_where(&mut self, take: impl Fn(&HeldFlush<M>) -> bool) -> Vec<HeldFlush<M>> {
        let (gone, kept): (Vec<_>, Vec<_>) = self.queue.drain(..).partition(take);
        self.queue = kept.into();
        gone
    }

    /// Takes out the flushes of `ep`, in order.
    pub(crate) fn take_ep(&mut self, ep: DriverEp) -> Vec<HeldFlush<M>> {
        self.take_where(|f| f.ep == ep)
    }

    /// Takes out every flush, in order.
    pub(crate) fn take_all(&mut self) -> Vec<HeldFlush<M>> {
        self.queue.drain(..).collect()
    }

    /// Calls `cover` on the flushes from the newest back, while it returns
    /// `true` (a commit covering those started since the last one).
    pub(crate) fn commit_tail(&mut self, mut cover: impl FnMut(&mut HeldFlush<M>) -> bool) {
        for f in self.queue.iter_mut().rev() {
            if !cover(f) {
                break;
            }
        }
    }
}
