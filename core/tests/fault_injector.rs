//! The `FaultInjector`'s programmable faults, through a real worker: lane
//! timing and lane failures, blocked flushes, duplicated flush completions
//! and injected strays; and, at the driver level, that duplicates and
//! strays really come out of `poll`.
//!
//! The initiator has two lanes: 8-byte PUTs take lane 0, `BIG`-byte PUTs
//! the bandwidth lane 1. Nothing synchronizes by sleeping or asserts on
//! time: progress runs in loops bounded by a count of calls.

use ringfence::{
    Completion, CompletionMode, Connect, Driver, DriverEp, EndpointId, EndpointState, Loopback,
    Posted, QueuePair, Quiesce, Quiesced, RegisteredBuf, RkeyId, Token, Worker,
};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe, Status};
use ringfence_testkit::{FaultHandle, FaultInjector, LoopbackTarget, Timing};
use std::collections::HashMap;

const BIG: u32 = 1024;
const SLOT: u64 = 1024;
/// Progress calls before a wait counts as hung.
const LIMIT: usize = 100_000;

/// An initiator whose driver is a `FaultInjector` over a synchronous
/// loopback, connected to one target exposing a window of 16 slots.
struct Rig {
    _target: Worker,
    initiator: Worker,
    fault: FaultHandle,
    window: RegisteredBuf,
    ep: EndpointId,
    rkey: RkeyId,
    src: RegisteredBuf,
    qp: QueuePair,
    /// Every CQE seen so far, by `user_data`: how many times.
    seen: HashMap<u64, Vec<i32>>,
}

fn rig(timing: Timing) -> Rig {
    let (injector, fault) = FaultInjector::new(Loopback::with_mode(CompletionMode::Immediate));
    fault.set_timing(timing);
    let initiator = Worker::builder()
        .lanes(2)
        .bw_threshold(BIG)
        .ring_entries(256, 256)
        .requests(512)
        .ignore_env()
        .driver(injector)
        .build()
        .unwrap();
    let LoopbackTarget {
        worker: target,
        window,
        ep,
        rkey,
    } = LoopbackTarget::connect(&initiator, 16 * SLOT as usize);
    let src = initiator.alloc_registered(BIG as usize).unwrap();
    src.write(0, &[0xaa; BIG as usize]);
    let qp = initiator.create_queue().unwrap();
    Rig {
        _target: target,
        initiator,
        fault,
        window,
        ep,
        rkey,
        src,
        qp,
        seen: HashMap::new(),
    }
}

impl Rig {
    fn raw_ep(&self) -> u32 {
        self.ep.as_raw()
    }

    /// A PUT to `slot` tagged `user_data`: 8 bytes on lane 0, or `BIG`
    /// bytes on lane 1.
    fn put(&self, slot: u64, big: bool, user_data: u64) -> Sqe {
        let remote = RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.window.addr() + slot * SLOT,
        };
        let len = if big { BIG } else { 8 };
        Sqe::put(self.raw_ep(), self.src.local(0), remote, len).with_user_data(user_data)
    }

    fn flush(&self, user_data: u64) -> Sqe {
        Sqe::flush(self.raw_ep()).with_user_data(user_data)
    }

    fn submit(&mut self, sqes: &[Sqe]) {
        let mut done = 0;
        for _ in 0..LIMIT {
            done += self.qp.push_batch(&sqes[done..]).unwrap();
            self.qp.submit();
            if done == sqes.len() {
                return;
            }
            self.step();
        }
        panic!("the SQ never drained: {done} of {} SQEs", sqes.len());
    }

    /// One progress call; records the CQEs it produced.
    fn step(&mut self) {
        self.initiator.progress();
        while let Some(c) = self.qp.pop().unwrap() {
            self.seen.entry(c.user_data).or_default().push(c.res);
        }
    }

    /// Progress until `done` holds, or panics naming `what`.
    fn until(&mut self, what: &str, mut done: impl FnMut(&Rig) -> bool) {
        for _ in 0..LIMIT {
            if done(self) {
                return;
            }
            self.step();
        }
        panic!("hung waiting for {what}; CQEs so far: {:?}", self.seen);
    }

    /// Progress until every one of `user_data` has completed.
    fn wait(&mut self, user_data: &[u64]) {
        self.until(&format!("CQEs {user_data:?}"), |r| {
            user_data.iter().all(|u| r.done(*u))
        });
    }

    /// `n` more progress calls.
    fn idle(&mut self, n: usize) {
        for _ in 0..n {
            self.step();
        }
    }

    fn done(&self, user_data: u64) -> bool {
        self.seen.contains_key(&user_data)
    }

    /// The single result of `user_data`: it completed exactly once.
    fn res(&self, user_data: u64) -> i32 {
        match self.seen.get(&user_data).map(Vec::as_slice) {
            Some(&[res]) => res,
            other => panic!("CQE {user_data}: expected exactly one, got {other:?}"),
        }
    }

    fn assert_ok(&self, user_data: &[u64]) {
        for &u in user_data {
            let res = self.res(u);
            assert!(res >= 0, "{u}: {}", ringfence_ring::strerror(res));
        }
    }

    /// Exactly the CQEs `user_data` arrived, once each.
    fn assert_only(&self, user_data: &[u64]) {
        for &u in user_data {
            self.res(u);
        }
        let mut extra: Vec<_> = self
            .seen
            .keys()
            .filter(|u| !user_data.contains(u))
            .collect();
        extra.sort();
        assert!(extra.is_empty(), "CQEs nobody submitted: {extra:?}");
    }

    /// The (lane, slot) of each operation that took effect, in order.
    fn log(&self) -> Vec<(u8, u64)> {
        self.fault
            .log()
            .iter()
            .map(|x| (x.lane, (x.remote_addr - self.window.addr()) / SLOT))
            .collect()
    }

    fn byte_at(&self, slot: u64) -> u8 {
        let mut b = [0u8; 1];
        self.window.read((slot * SLOT) as usize, &mut b);
        b[0]
    }
}

fn code(status: Status) -> i32 {
    status as i32
}

// ------------------------------------------------------------ lane timing

#[test]
fn a_lane_with_its_own_timing_completes_after_a_faster_lane() {
    let mut r = rig(Timing::NextPoll);
    r.fault.set_lane_timing(1, Timing::Delayed(200));
    r.submit(&[r.put(0, true, 0), r.put(1, false, 1)]);
    r.wait(&[1]);
    assert!(!r.done(0), "the delayed lane kept pace with the fast one");
    assert_eq!(r.log(), [(0, 1)]);
    assert_eq!(r.fault.held(), 1, "the lane-1 PUT is still held");
    r.wait(&[0]);
    assert_eq!(r.log(), [(0, 1), (1, 0)]);

    // A FLUSH of the slow lane waits for its PUT, under the global timing.
    r.submit(&[r.put(2, true, 2), r.flush(3)]);
    r.wait(&[3]);
    assert!(r.done(2), "the FLUSH finished before the PUT it covers");
    assert_eq!(r.log().last(), Some(&(1, 2)));

    // The override moves: lane 0 slow, lane 1 back to the global timing.
    r.fault.clear_lane_timing(1);
    r.fault.set_lane_timing(0, Timing::Delayed(200));
    r.submit(&[r.put(4, false, 4), r.put(5, true, 5)]);
    r.wait(&[5]);
    assert!(!r.done(4), "lane 0 did not take its new timing");
    r.wait(&[4]);
    r.assert_ok(&[0, 1, 2, 3, 4, 5]);
    assert_eq!(&r.log()[3..], [(1, 5), (0, 4)]);
    r.idle(10);
    r.assert_only(&[0, 1, 2, 3, 4, 5]);
    assert_eq!(r.fault.held(), 0);
}

#[test]
fn a_synchronous_lane_runs_inside_post_but_waits_behind_what_it_holds() {
    let mut r = rig(Timing::Delayed(200));
    r.fault.set_lane_timing(0, Timing::Synchronous);
    r.submit(&[r.put(0, true, 0), r.put(1, false, 1)]);
    r.wait(&[1]);
    assert_eq!(r.log(), [(0, 1)], "the synchronous lane ran at once");
    assert_eq!(r.fault.held(), 1, "only the lane-1 PUT is held");

    // Lane 0 holds a slow PUT; a synchronous one behind it must not pass.
    r.fault.set_lane_timing(0, Timing::Delayed(200));
    r.submit(&[r.put(2, false, 2)]);
    r.until("the slow lane-0 PUT held", |r| r.fault.held() == 2);
    r.fault.set_lane_timing(0, Timing::Synchronous);
    r.submit(&[r.put(3, false, 3)]);
    r.until("the synchronous PUT held behind it", |r| {
        r.fault.held() == 3 || r.done(3)
    });
    assert!(!r.done(3), "the synchronous PUT overtook a held one");
    assert!(!r.log().contains(&(0, 3)));
    r.wait(&[0, 2, 3]);
    r.assert_ok(&[0, 1, 2, 3]);
    let lane0: Vec<u64> = r.log().iter().filter(|x| x.0 == 0).map(|x| x.1).collect();
    assert_eq!(lane0, [1, 2, 3], "lane 0 out of posting order");
    r.idle(10);
    r.assert_only(&[0, 1, 2, 3]);
    assert_eq!(r.fault.held(), 0);
}

// ----------------------------------------------------------- lane failures

#[test]
fn a_failing_lane_fails_only_its_own_ops_and_none_reach_the_target() {
    for timing in [Timing::NextPoll, Timing::Synchronous] {
        let mut r = rig(timing);
        r.fault.fail_lane(1, Status::AccessDenied);
        r.submit(&[
            r.put(0, true, 0),
            r.put(1, false, 1),
            r.put(2, true, 2),
            r.put(3, false, 3),
        ]);
        r.wait(&[0, 1, 2, 3]);
        for u in [0, 2] {
            assert_eq!(r.res(u), code(Status::AccessDenied), "{timing:?}: {u}");
        }
        r.assert_ok(&[1, 3]);
        assert_eq!(r.log(), [(0, 1), (0, 3)], "{timing:?}: a failed op ran");
        assert_eq!((r.byte_at(0), r.byte_at(2)), (0, 0), "{timing:?}");
        assert_eq!((r.byte_at(1), r.byte_at(3)), (0xaa, 0xaa), "{timing:?}");
        let state = r.initiator.endpoint_state(r.ep).unwrap();
        assert_eq!(state, EndpointState::Connected, "{timing:?}");

        // Just the next post on lane 0, and lane 1 recovered.
        r.fault.clear_lane_failures();
        r.fault.fail_next_on_lane(0, Status::OutOfBounds);
        r.submit(&[r.put(4, false, 4), r.put(5, false, 5), r.put(6, true, 6)]);
        r.wait(&[4, 5, 6]);
        assert_eq!(r.res(4), code(Status::OutOfBounds), "{timing:?}");
        r.assert_ok(&[5, 6]);
        assert_eq!(&r.log()[2..], [(0, 5), (1, 6)], "{timing:?}");
        r.idle(10);
        r.assert_only(&[0, 1, 2, 3, 4, 5, 6]);
    }
}

// --------------------------------------------------------- blocked flushes

#[test]
fn a_blocked_flush_stays_incomplete_until_unblocked() {
    for timing in [Timing::NextPoll, Timing::Synchronous] {
        let mut r = rig(timing);
        r.fault.block_flushes(true);
        r.submit(&[r.put(0, true, 0), r.flush(1)]);
        r.until("the FLUSH handed to the driver", |r| {
            !r.fault.flushes().is_empty()
        });
        r.idle(1000);
        assert!(r.done(0), "{timing:?}: the PUT before the FLUSH hung");
        assert!(!r.done(1), "{timing:?}: a blocked flush completed");
        assert_eq!(r.fault.flushes().len(), 1, "{timing:?}");
        assert_eq!(r.fault.held(), 1, "{timing:?}: the FLUSH is held");

        r.fault.block_flushes(false);
        r.wait(&[1]);
        r.assert_ok(&[0, 1]);
        assert_eq!(r.fault.held(), 0, "{timing:?}");
        r.idle(10);
        r.assert_only(&[0, 1]);
    }
}

#[test]
fn a_blocked_fence_flush_defers_what_follows_the_fence() {
    for timing in [Timing::NextPoll, Timing::Synchronous] {
        let mut r = rig(timing);
        r.fault.block_flushes(true);
        let fence = Sqe::fence(r.raw_ep(), FenceMode::COMPLETE).with_user_data(1);
        r.submit(&[r.put(0, true, 0), fence, r.put(1, true, 2)]);
        r.until("the fence's flush handed to the driver", |r| {
            !r.fault.flushes().is_empty()
        });
        r.idle(1000);
        assert!(!r.done(2), "{timing:?}: a PUT passed a blocked fence");
        assert_eq!(r.log(), [(1, 0)], "{timing:?}");

        r.fault.block_flushes(false);
        r.wait(&[0, 1, 2]);
        r.assert_ok(&[0, 1, 2]);
        assert_eq!(r.log(), [(1, 0), (1, 1)], "{timing:?}");
        r.idle(10);
        r.assert_only(&[0, 1, 2]);
        assert_eq!(r.fault.held(), 0, "{timing:?}");
    }
}

// --------------------------------------- duplicated and stray completions

#[test]
fn duplicated_flush_completions_complete_each_request_once() {
    for timing in [Timing::NextPoll, Timing::Synchronous] {
        let mut r = rig(timing);
        r.fault.duplicate_flush_completions(2);
        // A user FLUSH; its duplicate comes while nothing else is posted.
        r.submit(&[r.put(0, true, 0), r.flush(1)]);
        r.wait(&[0, 1]);
        r.idle(100);
        r.assert_only(&[0, 1]);
        // A strong fence's flush, with a PUT deferred behind it.
        let fence = Sqe::fence(r.raw_ep(), FenceMode::COMPLETE).with_user_data(3);
        r.submit(&[r.put(1, true, 2), fence, r.put(2, true, 4)]);
        r.wait(&[2, 3, 4]);
        r.idle(100);
        r.assert_ok(&[0, 1, 2, 3, 4]);
        r.assert_only(&[0, 1, 2, 3, 4]);
        assert_eq!(r.fault.flushes().len(), 2, "{timing:?}");
        assert_eq!(r.log(), [(1, 0), (1, 1), (1, 2)], "{timing:?}");
        let state = r.initiator.endpoint_state(r.ep).unwrap();
        assert_eq!(state, EndpointState::Connected, "{timing:?}");
    }
}

#[test]
fn a_stray_completion_completes_nothing() {
    let mut r = rig(Timing::NextPoll);
    r.fault.set_lane_timing(1, Timing::Delayed(50));
    r.submit(&[r.put(0, true, 0)]);
    r.until("the PUT held", |r| r.fault.held() == 1);
    // Tokens that name nothing in flight; a fatal status, which would fail
    // the endpoint if the engine took it for one of its requests.
    r.fault.stray_flush_completion(Token::NONE, Ok(0));
    r.fault
        .stray_flush_completion(Token(u64::from(u32::MAX)), Err(Status::Transport));
    r.wait(&[0]);
    r.submit(&[r.put(1, false, 1)]);
    r.wait(&[1]);
    r.idle(10);
    r.assert_ok(&[0, 1]);
    r.assert_only(&[0, 1]);
    let state = r.initiator.endpoint_state(r.ep).unwrap();
    assert_eq!(state, EndpointState::Connected);
}

// ------------------------------------------------------- at the driver level

/// A `FaultInjector` over a synchronous loopback, connected to itself with
/// two lanes.
fn driver() -> (FaultInjector<Loopback>, FaultHandle, DriverEp) {
    let (mut injector, fault) = FaultInjector::new(Loopback::with_mode(CompletionMode::Immediate));
    let address = injector.address();
    let ep = match injector.connect(&address, 2, Token(0)).unwrap() {
        Connect::Done(ep) | Connect::InFlight(ep) => ep,
    };
    (injector, fault, ep)
}

fn poll(injector: &mut FaultInjector<Loopback>) -> Vec<Completion> {
    let mut out = [Completion::new(Token(0), Ok(0)); 16];
    let n = injector.poll(&mut out);
    out[..n].to_vec()
}

#[test]
fn duplicates_come_out_twice_and_strays_at_the_next_poll() {
    let ok = |token| Completion::new(Token(token), Ok(0));
    // What `flush` answers, then what each poll returns: the copy comes at
    // the second poll after the original.
    let cases: [(Timing, Posted, &[&[Completion]]); 2] = [
        (
            Timing::NextPoll,
            Posted::InFlight,
            &[&[ok(7)], &[], &[ok(7)], &[]],
        ),
        (
            Timing::Synchronous,
            Posted::Done(Ok(0)),
            &[&[], &[ok(7)], &[]],
        ),
    ];
    for (timing, posted, expected) in cases {
        let (mut d, fault, ep) = driver();
        fault.set_timing(timing);
        fault.duplicate_flush_completions(1);
        assert_eq!(d.flush(ep, 0b10, Token(7)), posted, "{timing:?}");
        let polls: Vec<Vec<Completion>> = expected.iter().map(|_| poll(&mut d)).collect();
        assert_eq!(polls, expected, "{timing:?}");
        assert_eq!(fault.held(), 0, "{timing:?}");

        // Only the next `n` are duplicated.
        let posted = d.flush(ep, 0b10, Token(8));
        let later: Vec<Completion> = (0..4).flat_map(|_| poll(&mut d)).collect();
        match posted {
            Posted::InFlight => assert_eq!(later, [ok(8)], "{timing:?}"),
            _ => assert_eq!(later, [], "{timing:?}"),
        }

        let stray = Completion::new(Token(99), Err(Status::Transport));
        fault.stray_flush_completion(stray.token, stray.result);
        assert_eq!(poll(&mut d), [stray], "{timing:?}");
        assert_eq!(poll(&mut d), [], "{timing:?}");
    }
}

#[test]
fn blocked_flushes_are_held_even_when_synchronous_and_quiesce_cancels_them() {
    let (mut d, fault, ep) = driver();
    fault.set_timing(Timing::Synchronous);
    fault.block_flushes(true);
    assert_eq!(d.flush(ep, 0b01, Token(1)), Posted::InFlight);
    assert_eq!(d.flush(ep, 0b11, Token(2)), Posted::InFlight);
    assert_eq!(fault.held(), 2);
    for _ in 0..100 {
        assert_eq!(poll(&mut d), []);
    }
    // Unblocked: released at the next poll.
    fault.block_flushes(false);
    let tokens: Vec<Token> = poll(&mut d).iter().map(|c| c.token).collect();
    assert_eq!(tokens, [Token(1), Token(2)]);
    assert_eq!(fault.held(), 0);

    fault.block_flushes(true);
    assert_eq!(d.flush(ep, 0b01, Token(3)), Posted::InFlight);
    assert_eq!(d.quiesce(Quiesce::All), Quiesced::Done);
    assert_eq!(fault.held(), 0);
    assert_eq!(
        poll(&mut d),
        [Completion::new(Token(3), Err(Status::Canceled))]
    );
}
