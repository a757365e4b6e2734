//! Endpoints: a peer worker reached over one connection per lane, the
//! flushes in flight on it, and what is reported of them (answered
//! requests, finished flushes, finished or failed connects).

use crate::lane::Lane;
use crate::wire::Address;
use ringfence::{Completion, Token};
use ringfence_ring::Status;
use std::collections::VecDeque;

/// Flushes in flight per endpoint.
pub(super) const MAX_FLUSHES: usize = 64;

/// Where an endpoint is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EpState {
    /// Greeting the peer on every lane; the connect's completion (this
    /// token) comes once every HELLO is answered.
    Connecting(Token),
    /// Every lane is up: operations may be posted.
    Up,
    /// Failed: every request on it completes with this status.
    Failed(Status),
    /// Released by `disconnect` (failed, with this status, first): the
    /// slot goes once everything is reported.
    Released(Status),
}

impl EpState {
    /// The status its requests fail with, once it failed (released or
    /// not).
    pub(super) fn failed(self) -> Option<Status> {
        match self {
            EpState::Failed(status) | EpState::Released(status) => Some(status),
            EpState::Connecting(_) | EpState::Up => None,
        }
    }
}

/// A flush in flight.
#[derive(Debug)]
pub(super) struct Flush {
    pub(super) token: Token,
    /// Lanes still to report everything the flush covers.
    pub(super) remaining: u32,
}

/// One endpoint: a connection to a peer worker over `lanes.len()` TCP
/// connections.
#[derive(Debug)]
pub(super) struct Ep {
    /// The peer's listening address and instance.
    pub(super) peer: Address,
    pub(super) state: EpState,
    /// One per lane, each on its own connection.
    pub(super) lanes: Vec<Lane>,
    /// Flushes in flight, by slot (a lane's marks name the slot).
    pub(super) flushes: Vec<Option<Flush>>,
    /// It is on the list of endpoints with answers to report
    /// ([`Endpoints::report`]).
    pub(super) on_report_list: bool,
}

/// Every endpoint, by handle, and what is to be reported of them.
#[derive(Debug)]
pub(super) struct Endpoints {
    slots: Vec<Option<Ep>>,
    /// Endpoints with answers to report (each once: `Ep::on_report_list`).
    to_report: Vec<u32>,
    /// Completions produced outside the lanes' answers: flushes, connects.
    ready: VecDeque<Completion>,
}

impl Endpoints {
    pub(super) fn new() -> Endpoints {
        Endpoints {
            slots: Vec::new(),
            to_report: Vec::with_capacity(64),
            ready: VecDeque::with_capacity(4096),
        }
    }

    /// Endpoint `e`, if there is one.
    pub(super) fn get(&self, e: u32) -> Option<&Ep> {
        self.slots.get(e as usize)?.as_ref()
    }

    /// Endpoint `e`, if there is one.
    pub(super) fn get_mut(&mut self, e: u32) -> Option<&mut Ep> {
        self.slots.get_mut(e as usize)?.as_mut()
    }

    /// Lane `lane` of endpoint `e`, if there are both.
    pub(super) fn lane_mut(&mut self, e: u32, lane: u8) -> Option<&mut Lane> {
        self.get_mut(e)?.lanes.get_mut(usize::from(lane))
    }

    /// A free handle (the lowest), for [`Endpoints::insert`].
    pub(super) fn free_handle(&mut self) -> u32 {
        match self.slots.iter().position(Option::is_none) {
            Some(e) => e as u32,
            None => {
                self.slots.push(None);
                self.slots.len() as u32 - 1
            }
        }
    }

    /// Puts `ep` at handle `e` (from [`Endpoints::free_handle`]).
    pub(super) fn insert(&mut self, e: u32, ep: Ep) {
        self.slots[e as usize] = Some(ep);
    }

    /// Lists endpoint `e` as having answers to report (once).
    pub(super) fn report(&mut self, e: u32) {
        if let Some(ep) = self.slots.get_mut(e as usize).and_then(Option::as_mut)
            && !ep.on_report_list
        {
            ep.on_report_list = true;
            self.to_report.push(e);
        }
    }

    /// Fails endpoint `e`: every request not yet answered completes with
    /// `status`, so do its flushes and a connect in progress. Returns the
    /// connections of its lanes, to let go of; `None` if it failed before
    /// (or there is no such endpoint).
    pub(super) fn fail(&mut self, e: u32, status: Status) -> Option<Vec<u32>> {
        let ep = self.slots.get_mut(e as usize)?.as_mut()?;
        if ep.state.failed().is_some() {
            return None;
        }
        if let EpState::Connecting(token) = ep.state {
            self.ready.push_back(Completion::new(token, Err(status)));
        }
        tracing::debug!(ep = e, %status, "tcp endpoint failed");
        ep.state = EpState::Failed(status);
        let conns = ep.lanes.iter().map(|l| l.conn).collect();
        for lane in &mut ep.lanes {
            lane.fail_all(status);
        }
        self.report(e);
        Some(conns)
    }

    /// Endpoint `e`, failed, is released (`disconnect`): its slot goes
    /// once everything is reported.
    pub(super) fn release(&mut self, e: u32) {
        if let Some(ep) = self.get_mut(e)
            && let Some(status) = ep.state.failed()
        {
            ep.state = EpState::Released(status);
        }
    }

    /// Reports answered requests, finished flushes and finished connects
    /// into `out` from index `n`; returns the new `n`.
    pub(super) fn emit(&mut self, out: &mut [Completion], mut n: usize) -> usize {
        let mut i = 0;
        while i < self.to_report.len() && n < out.len() {
            let e = self.to_report[i];
            let Some(ep) = self.slots.get_mut(e as usize).and_then(Option::as_mut) else {
                self.to_report.swap_remove(i);
                continue;
            };
            if let EpState::Connecting(token) = ep.state
                && ep.lanes.iter().all(|l| l.up)
            {
                ep.state = EpState::Up;
                self.ready.push_back(Completion::new(token, Ok(0)));
            }
            let failed = ep.state.failed();
            let mut done = true;
            for lane in &mut ep.lanes {
                n = lane.emit(out, n);
                while let Some(&(f, seq)) = lane.marks.front() {
                    if !lane.reported(seq) {
                        break;
                    }
                    lane.marks.pop_front();
                    let Some(flush) = ep.flushes.get_mut(f as usize).and_then(Option::as_mut)
                    else {
                        continue;
                    };
                    flush.remaining -= 1;
                    if flush.remaining == 0 {
                        self.ready
                            .push_back(Completion::new(flush.token, failed.map_or(Ok(0), Err)));
                        ep.flushes[f as usize] = None;
                    }
                }
                done &= lane.answered == 0;
            }
            if done {
                ep.on_report_list = false;
                self.to_report.swap_remove(i);
                let released = matches!(ep.state, EpState::Released(_));
                if released && ep.lanes.iter().all(|l| l.pending.is_empty()) {
                    self.slots[e as usize] = None;
                }
            } else {
                i += 1;
            }
        }
        while n < out.len() {
            let Some(c) = self.ready.pop_front() else {
                break;
            };
            out[n] = c;
            n += 1;
        }
        n
    }
}
