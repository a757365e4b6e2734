//! The held operations of every endpoint, one queue per lane, and which
//! of them may go next.

use super::{HeldOp, Moment};
use ringfence::{DriverEp, LaneMask};
use std::collections::VecDeque;

/// Held operations by endpoint handle and lane, in posting order per lane.
#[derive(Debug)]
pub(crate) struct HeldLanes<M> {
    /// By endpoint handle, then lane.
    eps: Vec<Vec<VecDeque<HeldOp<M>>>>,
    /// Operations held, over every queue.
    len: usize,
    /// The last sequence number given out.
    seq: u64,
}

impl<M: Copy> HeldLanes<M> {
    /// Nothing held, no endpoint.
    pub(crate) fn new() -> HeldLanes<M> {
        HeldLanes {
            eps: Vec::new(),
            len: 0,
            seq: 0,
        }
    }

    /// Gives endpoint `ep` `lanes` empty queues of `capacity` each
    /// (replacing what a handle used before had).
    pub(crate) fn open(&mut self, ep: DriverEp, lanes: u8, capacity: usize) {
        let index = ep.0 as usize;
        if self.eps.len() <= index {
            self.eps.resize_with(index + 1, Vec::new);
        }
        self.len -= self.eps[index].iter().map(VecDeque::len).sum::<usize>();
        self.eps[index] = (0..lanes)
            .map(|_| VecDeque::with_capacity(capacity))
            .collect();
    }

    /// Operations held, over every endpoint and lane.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Endpoint handles seen so far (one past the largest).
    pub(crate) fn endpoints(&self) -> usize {
        self.eps.len()
    }

    /// The lanes of endpoint handle `ep` (0 for one never opened).
    pub(crate) fn lanes(&self, ep: usize) -> usize {
        self.eps.get(ep).map_or(0, Vec::len)
    }

    /// The next sequence number: posting order over every lane.
    pub(crate) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The last sequence number given out: a flush started now covers
    /// every operation up to it.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// The queue of `lane` of `ep`, if it has one.
    pub(crate) fn lane(&self, ep: DriverEp, lane: u8) -> Option<&VecDeque<HeldOp<M>>> {
        self.eps.get(ep.0 as usize)?.get(usize::from(lane))
    }

    /// Whether `ep` has a lane `lane`.
    pub(crate) fn has_lane(&self, ep: DriverEp, lane: u8) -> bool {
        self.lane(ep, lane).is_some()
    }

    /// Whether nothing is held on `lane` of `ep` (or there is no such lane).
    pub(crate) fn is_idle(&self, ep: DriverEp, lane: u8) -> bool {
        self.lane(ep, lane).is_none_or(VecDeque::is_empty)
    }

    /// Whether nothing is held on any lane of `ep`.
    pub(crate) fn ep_is_idle(&self, ep: DriverEp) -> bool {
        self.eps
            .get(ep.0 as usize)
            .is_none_or(|lanes| lanes.iter().all(VecDeque::is_empty))
    }

    /// Every operation held on `ep`, lane by lane.
    pub(crate) fn ops(&self, ep: DriverEp) -> impl Iterator<Item = &HeldOp<M>> {
        self.eps.get(ep.0 as usize).into_iter().flatten().flatten()
    }

    /// Holds `held` at the back of its lane (`held.op.lane`) of `ep`;
    /// gives it back if there is no such lane.
    pub(crate) fn push(&mut self, ep: DriverEp, held: HeldOp<M>) -> Result<(), HeldOp<M>> {
        let Some(queue) = self
            .eps
            .get_mut(ep.0 as usize)
            .and_then(|lanes| lanes.get_mut(usize::from(held.op.lane)))
        else {
            return Err(held);
        };
        queue.push_back(held);
        self.len += 1;
        Ok(())
    }

    /// Whether any of `lanes` of `ep` still holds an operation with a
    /// sequence number up to `seq`: what keeps a flush that covers them.
    pub(crate) fn holds_before(&self, ep: DriverEp, lanes: LaneMask, seq: u64) -> bool {
        self.eps.get(ep.0 as usize).is_some_and(|queues| {
            queues
                .iter()
                .enumerate()
                .any(|(l, q)| lanes & (1 << l) != 0 && q.iter().any(|h| h.seq <= seq))
        })
    }

    /// How many operations of `lane` of `ep` may go now: on an ordered
    /// lane, one if a channel's head is due ([`pick`](HeldLanes::pick));
    /// on an unordered one, those due before the first later operation
    /// that carries the transport fence flag.
    pub(crate) fn eligible(&self, ep: DriverEp, lane: u8, ordered: bool, at: Moment) -> usize {
        let Some(queue) = self.lane(ep, lane) else {
            return 0;
        };
        if ordered {
            usize::from(ordered_head(queue, at).is_some())
        } else {
            unordered_eligible(queue, at)
        }
    }

    /// The index in its queue of the operation of `lane` of `ep` to go
    /// next, if any may: on an ordered lane the oldest operation that is
    /// due and first of its channel; on an unordered one the `draw(n)`-th
    /// of the `n` eligible ones ([`eligible`](HeldLanes::eligible)).
    pub(crate) fn pick(
        &self,
        ep: DriverEp,
        lane: u8,
        ordered: bool,
        at: Moment,
        draw: impl FnOnce(usize) -> usize,
    ) -> Option<usize> {
        let queue = self.lane(ep, lane)?;
        if ordered {
            return ordered_head(queue, at);
        }
        let n = unordered_eligible(queue, at);
        if n == 0 {
            return None;
        }
        let k = draw(n);
        Some(
            queue
                .iter()
                .enumerate()
                .filter(|(_, h)| h.is_due(at))
                .nth(k)
                .map_or(0, |(i, _)| i),
        )
    }

    /// Takes the operation at `index` of `lane` of `ep` out.
    ///
    /// # Panics
    /// If there is none there.
    pub(crate) fn take(&mut self, ep: DriverEp, lane: u8, index: usize) -> HeldOp<M> {
        let held = self.eps[ep.0 as usize][usize::from(lane)]
            .remove(index)
            .expect("a held operation at that index");
        self.len -= 1;
        held
    }

    /// Puts an operation taken out back where it was.
    pub(crate) fn put_back(&mut self, ep: DriverEp, lane: u8, index: usize, held: HeldOp<M>) {
        self.eps[ep.0 as usize][usize::from(lane)].insert(index, held);
        self.len += 1;
    }

    /// Takes out everything held on `ep`, lane by lane, in order.
    pub(crate) fn drain_ep(&mut self, ep: DriverEp) -> Vec<HeldOp<M>> {
        let mut out = Vec::new();
        if let Some(lanes) = self.eps.get_mut(ep.0 as usize) {
            for queue in lanes.iter_mut() {
                out.extend(queue.drain(..));
            }
        }
        self.len -= out.len();
        out
    }

    /// Takes out every operation (endpoint by endpoint, lane by lane, in
    /// order) for which `take` holds.
    pub(crate) fn take_where(
        &mut self,
        mut take: impl FnMut(DriverEp, u8, &HeldOp<M>) -> bool,
    ) -> Vec<HeldOp<M>> {
        let mut out = Vec::new();
        for (e, lanes) in self.eps.iter_mut().enumerate() {
            for (l, queue) in lanes.iter_mut().enumerate() {
                let (ep, lane) = (DriverEp(e as u32), l as u8);
                queue.retain(|h| {
                    let taken = take(ep, lane, h);
                    if taken {
                        out.push(*h);
                    }
                    !taken
                });
            }
        }
        self.len -= out.len();
        out
    }

    /// Calls `cover` on the operations of `lane` of `ep` from the newest
    /// back, while it returns `true` (a commit covering what was posted
    /// since the last one: the tail of the lane).
    pub(crate) fn commit_tail(
        &mut self,
        ep: DriverEp,
        lane: u8,
        mut cover: impl FnMut(&mut HeldOp<M>) -> bool,
    ) {
        let Some(queue) = self
            .eps
            .get_mut(ep.0 as usize)
            .and_then(|lanes| lanes.get_mut(usize::from(lane)))
        else {
            return;
        };
        for h in queue.iter_mut().rev() {
            if !cover(h) {
                break;
            }
        }
    }
}

/// On an ordered lane: the oldest held operation that is due and first in
/// its channel (a replaced lane's old channel and its new one release
/// independently, as two connections would).
fn ordered_head<M>(queue: &VecDeque<HeldOp<M>>, at: Moment) -> Option<usize> {
    let first = queue.front()?;
    // Channels only grow, so a lane's queue is sorted by them and each
    // channel is one run of it. One channel (the usual case): only the
    // head may go.
    if queue.back().map(|h| h.channel) == Some(first.channel) {
        return first.is_due(at).then_some(0);
    }
    let mut channel = None;
    for (i, h) in queue.iter().enumerate() {
        if channel != Some(h.channel) {
            if h.is_due(at) {
                return Some(i);
            }
            channel = Some(h.channel);
        }
    }
    None
}

/// On an unordered lane: how many due operations come before the first
/// later one that carries the transport fence flag (which waits for
/// everything before it).
fn unordered_eligible<M>(queue: &VecDeque<HeldOp<M>>, at: Moment) -> usize {
    let fence_at = queue
        .iter()
        .skip(1)
        .position(|h| h.op.fence)
        .map_or(queue.len(), |i| i + 1);
    queue.iter().take(fence_at).filter(|h| h.is_due(at)).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::held::Due;
    use ringfence::{Op, OpKind, Token};

    const NOW: Moment = Moment { polls: 1, ns: 0 };

    fn held(lane: u8, seq: u64, channel: u32, fence: bool, due: bool) -> HeldOp<()> {
        HeldOp {
            op: Op {
                kind: OpKind::Put,
                lane,
                local_addr: 0,
                local_key: None,
                remote: None,
                len: 8,
                operand: 0,
                operand2: 0,
                fence,
            },
            token: Token(seq),
            seq,
            channel,
            due: Some(Due::Poll(if due { 1 } else { 2 })),
            meta: (),
        }
    }

    fn lanes(ops: &[HeldOp<()>]) -> HeldLanes<()> {
        let mut lanes = HeldLanes::new();
        lanes.open(DriverEp(0), 2, 0);
        for &h in ops {
            lanes.push(DriverEp(0), h).unwrap();
        }
        lanes
    }

    #[test]
    fn an_ordered_lane_releases_the_head_of_each_channel() {
        let ep = DriverEp(0);
        // One channel: only the head, and only once it is due.
        let l = lanes(&[held(0, 1, 0, false, false), held(0, 2, 0, false, true)]);
        assert_eq!(l.pick(ep, 0, true, NOW, |_| unreachable!()), None);
        // Two channels: the new one's head goes while the old one waits.
        let l = lanes(&[held(0, 1, 0, false, false), held(0, 2, 1, false, true)]);
        assert_eq!(l.pick(ep, 0, true, NOW, |_| unreachable!()), Some(1));
        assert_eq!(l.eligible(ep, 0, true, NOW), 1);
    }

    #[test]
    fn an_unordered_lane_draws_among_what_precedes_a_fence() {
        let ep = DriverEp(0);
        let l = lanes(&[
            held(1, 1, 0, false, true),
            held(1, 2, 0, false, false),
            held(1, 3, 0, false, true),
            held(1, 4, 0, true, true),
            held(1, 5, 0, false, true),
        ]);
        assert_eq!(
            l.eligible(ep, 1, false, NOW),
            2,
            "the due ones before the fence"
        );
        assert_eq!(l.pick(ep, 1, false, NOW, |n| n - 1), Some(2));
        assert!(l.holds_before(ep, 0b10, 1));
        assert!(!l.holds_before(ep, 0b01, 5), "nothing on lane 0");
    }

    #[test]
    fn the_count_follows_every_change() {
        let ep = DriverEp(0);
        let mut l = lanes(&[held(0, 1, 0, false, true), held(1, 2, 0, false, true)]);
        assert_eq!(l.len(), 2);
        let h = l.take(ep, 1, 0);
        assert_eq!(l.len(), 1);
        l.put_back(ep, 1, 0, h);
        assert_eq!(l.take_where(|_, lane, _| lane == 1).len(), 1);
        assert_eq!(l.drain_ep(ep).len(), 1);
        assert_eq!(l.len(), 0);
        assert!(l.ep_is_idle(ep));
    }
}
