//! `FaultInjector`: a driver wrapper that makes a well-behaved driver
//! misbehave on purpose, for tests of the fence engine.
//!
//! It holds every post and flush before handing it to the inner driver, and
//! lets it through according to a program set through its [`FaultHandle`]:
//!
//! - per-lane ordering: an ordered lane releases operations in posting
//!   order; an unordered lane releases any of its held operations, in a
//!   seeded pseudo-random order (an operation carrying the transport fence
//!   flag waits for everything before it on its lane);
//! - completion timing: synchronous (inside `post`), on the next poll, after
//!   N polls, or with lanes visited in a shuffled order; globally, or per
//!   lane index;
//! - injected errors on a chosen post or flush, on every or the next post
//!   of a lane, and `NoResource` back-pressure for the next N posts;
//! - lane generation bumps (the lane is "replaced"): what is held on the
//!   old channel is no longer ordered with what is posted on the new one,
//!   as with two connections, though a flush still waits for both; or
//!   what was held on the old channel is lost with it
//!   ([`Fails::Lost`]);
//! - an endpoint killed by one operation's error, as an RC queue pair's
//!   is: that completion names the endpoint's cause
//!   ([`Fails::Endpoint`]), and everything held or posted on it after
//!   is flushed as lost;
//! - blocked flushes (held until unblocked), duplicated flush completions
//!   and injected stray completions, as a network with lane replacement
//!   can produce.
//!
//! A flush is released only when every operation posted before it on its
//! lanes has been released and has completed at the inner driver, so it
//! means what a flush means. The order in which operations took effect at
//! the inner driver is recorded in an execution log, for tests to compare
//! with a model.
//!
//! The holding itself (per-lane queues, sequence numbers for flushes, the
//! release rule of ordered and unordered lanes, the seeded draws,
//! forwarding) is the test kit's held core, `crate::held`, which
//! [`SimDriver`](crate::SimDriver) shares; this module is the program.
//!
//! The inner driver should complete synchronously (the loopback driver in
//! [`CompletionMode::Immediate`](ringfence::CompletionMode::Immediate)): the
//! injector owns all timing. Completions the inner driver returns later are
//! passed through.

#![allow(unsafe_code)] // forwards the unsafe `post` and `execute`

use crate::held::{Due, HeldFlush, HeldFlushes, HeldLanes, HeldOp, Rng, now_ns};
use ringfence::{Completion, Driver, DriverEp, LaneMask, MAX_LANES};
use ringfence_ring::Status;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

pub use crate::held::Executed;

mod handle;
mod injector;
mod seam;

/// When held operations and flushes are released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// Inside `post` and `flush`, unless something posted earlier under
    /// another timing is still held on the lane (on one of the flushed
    /// lanes, for a flush) or flushes are blocked: then held, and released
    /// at the next poll behind it, so lane order is kept.
    Synchronous,
    /// At the next `poll`.
    NextPoll,
    /// After this many polls.
    Delayed(u32),
    /// At the next poll, visiting lanes (and endpoints) in a shuffled order.
    /// As a lane's own timing it is `NextPoll`: the visiting order follows
    /// the global timing.
    Reordered,
    /// At the first poll at least this long after posting: a latency in
    /// wall-clock time, as a network round trip has.
    Latency(std::time::Duration),
}

#[derive(Debug)]
struct Program {
    timing: Timing,
    unordered: LaneMask,
    /// The worker attached the injector: its capabilities are read.
    attached: bool,
    /// Fail the post whose number (0-based, counted over all posts) is the
    /// key, with the status.
    fail_posts: Vec<(u64, Status)>,
    /// Fail the flush whose number is the key.
    fail_flushes: Vec<(u64, Status)>,
    no_resource: u32,
    /// Lane generations, by endpoint handle and lane.
    generations: HashMap<(u32, u8), u32>,
    log: Vec<Executed>,
    flush_log: Vec<(DriverEp, LaneMask)>,
    seed: u64,
    /// Timing overrides, by lane index.
    lane_timing: [Option<Timing>; MAX_LANES as usize],
    /// Every post on the lane (by index) fails with the status.
    lane_failures: [Option<Status>; MAX_LANES as usize],
    /// Fail the next post on the lane that is the key, oldest first.
    next_lane_failures: Vec<(u8, Status)>,
    flushes_blocked: bool,
    /// How many of the next flush completions are duplicated.
    duplicate_flushes: u32,
    /// Completions to return at the next poll.
    strays: Vec<Completion>,
    /// Kill the endpoint of the post whose number is the first field: it
    /// fails with the second status, the endpoint with the third.
    kills: Vec<(u64, Status, Status)>,
    /// The same for the flush whose number is the first field.
    flush_kills: Vec<(u64, Status, Status)>,
    /// Lanes replaced with their old channel lost, with the generation
    /// they had: what the injector holds there is lost at the next poll.
    lost_lanes: Vec<(DriverEp, u8, u32)>,
    /// Endpoints whose held flushes are lost at the next poll.
    lost_flushes: Vec<DriverEp>,
}

/// Removes the first failure of `list` whose key matches, and returns it.
fn take_failure<K: Copy>(list: &mut Vec<(K, Status)>, hit: impl Fn(K) -> bool) -> Option<Status> {
    let i = list.iter().position(|&(k, _)| hit(k))?;
    Some(list.remove(i).1)
}

/// Polls between a duplicated flush completion and its copy.
const DUPLICATE_AFTER: u64 = 2;

/// Programs a [`FaultInjector`] after it moved into a worker, and reads its
/// execution log.
#[derive(Debug, Clone)]
pub struct FaultHandle {
    program: Arc<Mutex<Program>>,
    held: Arc<AtomicUsize>,
}

/// What the injector keeps with each held operation and flush.
#[derive(Debug, Clone, Copy)]
struct Fault {
    /// An injected failure: completes with it instead of executing.
    fail: Option<Status>,
    /// With `fail`: the endpoint dies, with this cause
    /// (`kill_endpoint_on_post`, `kill_endpoint_on_flush`).
    kill: Option<Status>,
}

/// A held operation; its channel is the lane's generation when it was
/// posted (channels of one lane are not ordered with each other).
type Held = HeldOp<Fault>;

/// The fault-injecting driver wrapper; see the module docs.
#[derive(Debug)]
pub struct FaultInjector<D: Driver> {
    inner: D,
    program: Arc<Mutex<Program>>,
    /// Posts and flushes held (kept up to date for `FaultHandle::held`).
    held_count: Arc<AtomicUsize>,
    /// Held operations per endpoint handle and lane.
    held: HeldLanes<Fault>,
    flushes: HeldFlushes<Fault>,
    ready: VecDeque<Completion>,
    /// Endpoint handles killed (`kill_endpoint_on_post`), until
    /// disconnected.
    dead: Vec<u32>,
    /// Copies of duplicated flush completions, by the poll that returns
    /// them (in order).
    late: VecDeque<(u64, Completion)>,
    posts: u64,
    flush_count: u64,
    polls: u64,
    /// The time of the current poll (for `Timing::Latency`).
    now: u64,
    /// Seeded from the program at the first draw.
    rng: Rng,
}

/// When something posted now, at poll `polls`, under `timing` may be
/// released: after the timing's polls, or its latency.
fn due(timing: Timing, polls: u64) -> Due {
    match timing {
        Timing::Latency(latency) => Due::after_time(now_ns(), latency),
        // Held only behind something else: at the next poll.
        Timing::Synchronous | Timing::NextPoll | Timing::Reordered => Due::after_polls(polls, 1),
        Timing::Delayed(n) => Due::after_polls(polls, u64::from(n)),
    }
}
