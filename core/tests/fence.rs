//! The fence engine against docs/fence.md, over the loopback driver wrapped in a
//! `FaultInjector`: one named test per rule family and per review warning
//! (W1–W6), memory-effect tests on out-of-order lanes, and a model-based
//! property test.
//!
//! Every test body runs twice (see `over_both!` at the end): over the
//! injector on a synchronous loopback (`over_loopback::`), and over the
//! injector on a `SimDriver` (`over_sim::`), where nothing executes before
//! the round's commit, effects land only at completion, lanes complete out
//! of order, and flushes wait for what they cover. Tests about the
//! synchronous path alone (a flush finished inside its own start, runs of
//! PUTs executed inline) run on loopback only, and say so.

use proptest::prelude::*;
use ringfence::{
    CompletionMode, DriverEp, EndpointId, Loopback, OpKind, QueuePair, RegisteredBuf, RkeyId,
    Worker,
};
use ringfence_ring::{CloseMode, Cqe, FenceMode, RemoteBuf, Sqe, Status};
use ringfence_testkit::{
    Executed, FaultHandle, FaultInjector, SimDriver, SimHandle, SimTiming, Timing,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIG: u32 = 1024;
const SLOT: u64 = 1024;
const HANG: Duration = Duration::from_secs(30);

/// The driver under the injector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// Loopback, completing inside `post`: the injector owns all timing.
    Loopback,
    /// `SimDriver` over loopback, completing what the injector releases
    /// to it with this timing after the commit that covers it.
    Sim(SimTiming),
}

/// An initiator whose driver is a FaultInjector over loopback (or over a
/// `SimDriver` over loopback), connected to `endpoints` targets; each
/// target exposes a window of `slots` slots.
struct Rig {
    _targets: Vec<Worker>,
    initiator: Worker,
    fault: FaultHandle,
    sim: Option<SimHandle>,
    windows: Vec<RegisteredBuf>,
    eps: Vec<(EndpointId, RkeyId)>,
    src: RegisteredBuf,
    qp: QueuePair,
}

fn rig(over: Over, lanes: u8, endpoints: usize, timing: Timing, cq: u32) -> Rig {
    let loopback = Loopback::with_mode(CompletionMode::Immediate);
    let (initiator, fault, sim) = {
        let mut builder = Worker::builder();
        builder
            .lanes(lanes)
            .bw_threshold(BIG)
            .ring_entries(1024, cq)
            .requests(2048)
            .ignore_env();
        match over {
            Over::Loopback => {
                let (injector, fault) = FaultInjector::new(loopback);
                (builder.driver(injector).build().unwrap(), fault, None)
            }
            Over::Sim(timing) => {
                let (sim, handle) = SimDriver::new(loopback);
                handle.set_timing(timing);
                handle.seed(u64::from(lanes) * 31 + endpoints as u64);
                let (injector, fault) = FaultInjector::new(sim);
                (
                    builder.driver(injector).build().unwrap(),
                    fault,
                    Some(handle),
                )
            }
        }
    };
    fault.set_timing(timing);
    let mut targets = Vec::new();
    let mut windows = Vec::new();
    let mut eps = Vec::new();
    for _ in 0..endpoints {
        let t = Worker::builder()
            .driver(Loopback::new())
            .ignore_env()
            .build()
            .unwrap();
        let w = t.alloc_registered(512 * SLOT as usize).unwrap();
        let ep = initiator.connect(t.address()).unwrap();
        let rkey = initiator
            .unpack_rkey(ep, &t.pack_rkey(w.handle()).unwrap())
            .unwrap();
        targets.push(t);
        windows.push(w);
        eps.push((ep, rkey));
    }
    let src = initiator.alloc_registered(4 * SLOT as usize).unwrap();
    src.write(0, &[0xaa; BIG as usize]);
    src.write(BIG as usize, &[0xbb; BIG as usize]);
    let qp = initiator.create_queue().unwrap();
    Rig {
        _targets: targets,
        initiator,
        fault,
        sim,
        windows,
        eps,
        src,
        qp,
    }
}

impl Rig {
    /// The operations that took effect at the target, in order: recorded
    /// by the injector when its inner driver completes inside `post`, by
    /// the `SimDriver` (which executes them late) otherwise.
    fn log(&self) -> Vec<Executed> {
        match &self.sim {
            Some(sim) => sim.log(),
            None => self.fault.log(),
        }
    }

    /// Seeds the injector's shuffles and the simulated driver's lane order.
    fn seed(&self, seed: u64) {
        self.fault.seed(seed);
        if let Some(sim) = &self.sim {
            sim.seed(seed);
        }
    }

    fn ep(&self, e: usize) -> u32 {
        self.eps[e].0.as_raw()
    }

    fn remote(&self, e: usize, slot: u64) -> RemoteBuf {
        RemoteBuf {
            rkey: self.eps[e].1.as_raw(),
            addr: self.windows[e].addr() + slot * SLOT,
        }
    }

    /// A PUT of 8 bytes (lane 0) or of `BIG` bytes (a bandwidth lane) of the
    /// A (0xaa) or B (0xbb) pattern.
    fn put(&self, e: usize, slot: u64, big: bool, b: bool) -> Sqe {
        let len = if big { BIG } else { 8 };
        Sqe::put(
            self.ep(e),
            self.src.local(if b { u64::from(BIG) } else { 0 }),
            self.remote(e, slot),
            len,
        )
    }

    fn submit(&mut self, sqes: &[Sqe]) {
        let mut done = 0;
        let deadline = Instant::now() + HANG;
        while done < sqes.len() {
            assert!(Instant::now() < deadline, "the SQ never drained");
            done += self.qp.push_batch(&sqes[done..]).unwrap();
            self.qp.submit();
            if done < sqes.len() {
                self.initiator.progress();
            }
        }
    }

    /// Progress until `n` CQEs arrived.
    fn drain(&mut self, n: usize) -> Vec<Cqe> {
        let deadline = Instant::now() + HANG;
        let mut out = Vec::new();
        while out.len() < n {
            self.initiator.progress();
            while let Some(c) = self.qp.pop().unwrap() {
                out.push(c);
            }
            assert!(
                Instant::now() < deadline,
                "hung at {} of {n} CQEs",
                out.len()
            );
        }
        for _ in 0..5 {
            self.initiator.progress();
        }
        assert_eq!(
            self.qp.pop().unwrap(),
            None,
            "more CQEs than submitted SQEs"
        );
        if let Some(sim) = &self.sim {
            assert!(sim.violations().is_empty(), "{:?}", sim.violations());
            assert_eq!(sim.stats().executed_uncommitted, 0);
        }
        out
    }

    fn run(&mut self, sqes: &[Sqe]) -> Vec<Cqe> {
        let sqes = numbered(sqes);
        self.submit(&sqes);
        let mut cqes = self.drain(sqes.len());
        cqes.sort_by_key(|c| c.user_data);
        cqes
    }

    fn byte_at(&self, e: usize, slot: u64) -> u8 {
        let mut b = [0u8; 1];
        self.windows[e].read((slot * SLOT) as usize, &mut b);
        b[0]
    }

    fn stats(&self, e: usize) -> ringfence::Stats {
        self.initiator.endpoint_stats(self.eps[e].0).unwrap()
    }
}

/// `sqes` with `user_data` set to each one's index.
fn numbered(sqes: &[Sqe]) -> Vec<Sqe> {
    sqes.iter()
        .enumerate()
        .map(|(i, s)| s.with_user_data(i as u64))
        .collect()
}

fn strong(ep: u32) -> Sqe {
    Sqe::fence(ep, FenceMode::COMPLETE)
}

fn weak(ep: u32) -> Sqe {
    Sqe::fence(ep, FenceMode::ORDER)
}

fn all_ok(cqes: &[Cqe]) {
    for c in cqes {
        assert!(
            c.res >= 0,
            "{}: {}",
            c.user_data,
            ringfence_ring::strerror(c.res)
        );
    }
}

// ---------------------------------------------------------------- §2 fences

fn r5_a_fence_completes_at_once_and_orders(over: Over) {
    let mut r = rig(over, 3, 1, Timing::Delayed(5), 256);
    let ep = r.ep(0);
    let sqes = [
        r.put(0, 0, true, false),
        strong(ep).with_user_data(1),
        r.put(0, 0, true, true),
    ];
    let sqes = numbered(&sqes);
    r.submit(&sqes);
    r.initiator.progress();
    // The fence's CQE comes before the PUTs finish.
    let first = r.qp.pop().unwrap().expect("the fence completes at once");
    assert_eq!((first.user_data, first.res), (1, 0));
    all_ok(&r.drain(2));
    assert_eq!(r.byte_at(0, 0), 0xbb);
}

fn r7_put_fence_put_same_address_across_unordered_lanes_ends_with_b(over: Over) {
    // Lanes deliver out of order (shuffled, unordered): without the fence B
    // can land first; with it, never.
    let mut b_first_without_fence = 0;
    for seed in 0..100u64 {
        for fenced in [true, false] {
            let mut r = rig(over, 3, 1, Timing::Reordered, 256);
            r.fault.set_unordered(0b110);
            r.seed(seed);
            let ep = r.ep(0);
            let mut sqes = vec![r.put(0, 0, true, false)];
            if fenced {
                sqes.push(strong(ep));
            }
            sqes.push(r.put(0, 0, true, true));
            all_ok(&r.run(&sqes));
            let log = r.log();
            let lanes: Vec<u8> = log.iter().map(|x| x.lane).collect();
            assert_eq!(lanes.len(), 2);
            assert_ne!(lanes[0], lanes[1], "A and B travel on two lanes");
            if fenced {
                assert_eq!(r.byte_at(0, 0), 0xbb, "seed {seed}: the later PUT must win");
            } else if r.byte_at(0, 0) == 0xaa {
                b_first_without_fence += 1;
            }
        }
    }
    assert!(
        b_first_without_fence > 0,
        "the lanes never reordered: the test would prove nothing"
    );
}

fn r8_weak_fence_on_one_ordered_lane_is_a_fence_flag_not_a_flush(over: Over) {
    let mut r = rig(over, 1, 1, Timing::NextPoll, 256);
    let ep = r.ep(0);
    all_ok(&r.run(&[
        r.put(0, 0, false, false),
        weak(ep),
        r.put(0, 0, false, true),
    ]));
    let s = r.stats(0);
    assert_eq!((s.weak_fences, s.flushes), (1, 0));
    let log = r.log();
    assert_eq!(
        log.iter().map(|x| x.fence).collect::<Vec<_>>(),
        vec![false, true],
        "the flag rides on the next op"
    );
    assert_eq!(r.byte_at(0, 0), 0xbb);
}

fn r9_strong_fence_flushes_exactly_the_dirty_lanes(over: Over) {
    let mut r = rig(over, 4, 1, Timing::NextPoll, 256);
    let ep = r.ep(0);
    // Big PUTs go to lanes 1 and 2; the fence must flush {1, 2}, not lane 0
    // or 3; a weak fence across two lanes becomes strong too.
    all_ok(&r.run(&[
        r.put(0, 0, true, false),
        r.put(0, 1, true, false),
        weak(ep),
        r.put(0, 2, false, true),
    ]));
    assert_eq!(
        r.fault.flushes().iter().map(|f| f.1).collect::<Vec<_>>(),
        vec![0b0110]
    );
    assert_eq!(r.stats(0).weak_fences, 0);
    // The same lane, but unordered: strong as well (R9).
    let mut r = rig(over, 1, 1, Timing::NextPoll, 256);
    r.fault.set_unordered(0b1);
    let ep = r.ep(0);
    all_ok(&r.run(&[
        r.put(0, 0, false, false),
        weak(ep),
        r.put(0, 0, false, true),
    ]));
    assert_eq!((r.stats(0).weak_fences, r.stats(0).flushes), (0, 1));
}

fn r10_a_fence_with_nothing_outstanding_is_free(over: Over) {
    let mut r = rig(over, 4, 1, Timing::NextPoll, 256);
    let ep = r.ep(0);
    all_ok(&r.run(&[strong(ep), weak(ep), strong(ep), r.put(0, 0, true, false)]));
    let s = r.stats(0);
    assert_eq!((s.flushes, s.weak_fences, s.fences), (0, 0, 3));
    assert!(r.fault.flushes().is_empty());
}

fn r11_a_fence_storm_collapses_into_one_boundary(over: Over) {
    let mut r = rig(over, 4, 1, Timing::NextPoll, 2048);
    let ep = r.ep(0);
    let mut sqes = vec![r.put(0, 0, true, false), r.put(0, 1, true, false)];
    sqes.extend((0..500).map(|i| if i % 2 == 0 { strong(ep) } else { weak(ep) }));
    sqes.push(r.put(0, 2, true, true));
    all_ok(&r.run(&sqes));
    assert_eq!(r.fault.flushes().len(), 1, "500 fences, one flush");
}

// ---------------------------------------------------------------- §3 epochs

fn r13_r16_r18_later_requests_wait_in_order_behind_the_one_flush_in_flight(over: Over) {
    let mut r = rig(over, 4, 1, Timing::Delayed(3), 1024);
    let ep = r.ep(0);
    let mut sqes = vec![r.put(0, 0, true, false)];
    for round in 1..=3u64 {
        sqes.push(strong(ep));
        sqes.extend((0..10).map(|k| r.put(0, round * 16 + k, k % 2 == 0, true)));
    }
    all_ok(&r.run(&sqes));
    // Three boundaries, three flushes, each after everything before it.
    assert_eq!(r.fault.flushes().len(), 3);
    let log = r.log();
    let round_of = |x: &Executed| (x.remote_addr - r.windows[0].addr()) / SLOT / 16;
    let rounds: Vec<u64> = log.iter().map(round_of).collect();
    assert!(
        rounds.windows(2).all(|w| w[0] <= w[1]),
        "effects crossed a fence: {rounds:?}"
    );
    assert!(r.stats(0).deferrals >= 30);
}

fn r16_r45_other_endpoints_keep_flowing_while_one_waits_on_its_flush(over: Over) {
    let mut r = rig(over, 4, 2, Timing::Delayed(10), 256);
    let (a, b) = (r.ep(0), r.ep(1));
    let mut sqes = vec![
        r.put(0, 0, true, false),
        strong(a),
        r.put(0, 1, true, true).with_user_data(100),
    ];
    sqes.extend((0..5).map(|k| r.put(1, k, true, true).with_user_data(200 + k)));
    let sqes: Vec<Sqe> = sqes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if s.user_data == 0 {
                s.with_user_data(i as u64)
            } else {
                *s
            }
        })
        .collect();
    r.submit(&sqes);
    let cqes = r.drain(sqes.len());
    let pos = |ud: u64| cqes.iter().position(|c| c.user_data == ud).unwrap();
    for k in 0..5 {
        assert!(
            pos(200 + k) < pos(100),
            "endpoint B waited for endpoint A's fence"
        );
    }
    let _ = b;
}

// ---------------------------------------------------------------- §4 flush

fn r21_r23_a_user_flush_covers_deferred_requests_and_not_later_ones(over: Over) {
    let mut r = rig(over, 4, 1, Timing::Delayed(3), 256);
    let ep = r.ep(0);
    let sqes = [
        r.put(0, 0, true, false).with_user_data(1),
        strong(ep).with_user_data(2),
        r.put(0, 1, true, false).with_user_data(3), // deferred behind the fence
        Sqe::flush(ep).with_user_data(4),
    ];
    r.submit(&sqes);
    // Run until the FLUSH is posted, then make everything later slow.
    let deadline = Instant::now() + HANG;
    while r.fault.flushes().len() < 2 {
        r.initiator.progress();
        assert!(Instant::now() < deadline);
    }
    r.fault.set_timing(Timing::Delayed(1_000_000));
    r.submit(&[r.put(0, 2, true, true).with_user_data(5)]);
    let mut seen = Vec::new();
    while !seen.iter().any(|c: &Cqe| c.user_data == 4) {
        r.initiator.progress();
        while let Some(c) = r.qp.pop().unwrap() {
            seen.push(c);
        }
        assert!(
            Instant::now() < deadline,
            "the flush waited for a later PUT"
        );
    }
    let log = r.log();
    let slots: Vec<u64> = log
        .iter()
        .map(|x| (x.remote_addr - r.windows[0].addr()) / SLOT)
        .collect();
    assert!(
        slots.contains(&0) && slots.contains(&1),
        "the flush came before earlier PUTs landed: {slots:?}"
    );
    assert!(!slots.contains(&2));
}

fn r24_an_empty_flush_completes_at_once_without_the_driver(over: Over) {
    let mut r = rig(over, 2, 1, Timing::Delayed(5), 256);
    let ep = r.ep(0);
    all_ok(&r.run(&[Sqe::flush(ep)]));
    assert!(r.fault.flushes().is_empty());
}

// ---------------------------------------------------------------- §5 atomics

fn r27_r29_atomics_join_epochs_add_fence_fadd_sees_every_add(over: Over) {
    // UCX's test_ucp_fence: add, fence, fetch-add, 500 times; the fetched
    // value must be i + 1. Atomics use the last lane; the lanes are
    // unordered and shuffled, so only the fence can order the add before the
    // fetch-add (R27, R28); the fetched value is valid at the CQE (R29).
    for mode in [FenceMode::COMPLETE, FenceMode::ORDER] {
        let mut r = rig(over, 3, 1, Timing::Reordered, 256);
        r.fault.set_unordered(0b111);
        let ep = r.ep(0);
        for i in 0..500u64 {
            let sqes = [
                Sqe::atomic_add(ep, r.remote(0, 0), 1),
                Sqe::fence(ep, mode),
                Sqe::atomic_fadd(ep, r.src.local(3 * u64::from(BIG)), r.remote(0, 0), 0),
            ];
            all_ok(&r.run(&sqes));
            let mut fetched = [0u8; 8];
            r.src.read(3 * BIG as usize, &mut fetched);
            assert_eq!(
                u64::from_ne_bytes(fetched),
                i + 1,
                "{mode:?}: iteration {i}"
            );
        }
    }
}

// ---------------------------------------------------------------- §6 errors

fn r33_error_during_an_in_flight_fence_flush_with_1000_deferred_requests(over: Over) {
    let mut r = rig(over, 4, 1, Timing::Delayed(2), 2048);
    r.fault.fail_flush(0, Status::Transport);
    let ep = r.ep(0);
    let mut sqes = vec![r.put(0, 0, true, false), strong(ep)];
    sqes.extend((0..1000).map(|k| r.put(0, 1 + k % 400, k % 3 == 0, true)));
    let sqes = numbered(&sqes);
    r.submit(&sqes);
    let cqes = r.drain(sqes.len());
    // The 1000 deferred requests fail with the flush's error, in FIFO order.
    let deferred: Vec<&Cqe> = cqes.iter().filter(|c| c.user_data >= 2).collect();
    assert_eq!(deferred.len(), 1000);
    assert!(deferred.iter().all(|c| c.res == Status::Transport.as_raw()));
    assert!(
        deferred.windows(2).all(|w| w[0].user_data < w[1].user_data),
        "purge not in FIFO order"
    );
    // Sticky: later submissions fail at once with the first error.
    let later = r.run(&[r.put(0, 0, false, false), Sqe::flush(ep)]);
    assert!(later.iter().all(|c| c.res == Status::Transport.as_raw()));
    // R34: a fence on the failed endpoint is accepted.
    assert_eq!(r.run(&[strong(ep)])[0].res, 0);
}

fn r31_r35_a_failed_post_completes_once_and_only_that_operation_fails(over: Over) {
    let mut r = rig(over, 2, 1, Timing::NextPoll, 256);
    r.fault.fail_post(1, Status::AccessDenied);
    let cqes = r.run(&[
        r.put(0, 0, false, false),
        r.put(0, 1, false, false),
        r.put(0, 2, false, false),
    ]);
    let res: Vec<i32> = cqes.iter().map(|c| c.res).collect();
    assert_eq!(res, vec![8, Status::AccessDenied.as_raw(), 8]);
}

fn r19_no_resource_sends_the_head_back_to_the_head_of_the_queue(over: Over) {
    let mut r = rig(over, 3, 1, Timing::NextPoll, 256);
    r.fault.no_resource(7);
    let ep = r.ep(0);
    let sqes: Vec<Sqe> = (0..20)
        .map(|k| {
            if k == 10 {
                strong(ep)
            } else {
                r.put(0, k, true, k > 10)
            }
        })
        .collect();
    all_ok(&r.run(&sqes));
    let log = r.log();
    let slots: Vec<u64> = log
        .iter()
        .map(|x| (x.remote_addr - r.windows[0].addr()) / SLOT)
        .collect();
    assert_eq!(slots.len(), 19);
    // Per lane, posting order is kept under back-pressure ...
    for lane in 0..3 {
        let on_lane: Vec<u64> = log
            .iter()
            .filter(|x| x.lane == lane)
            .map(|x| (x.remote_addr - r.windows[0].addr()) / SLOT)
            .collect();
        assert!(
            on_lane.windows(2).all(|w| w[0] < w[1]),
            "lane {lane}: {on_lane:?}"
        );
    }
    // ... and nothing after the fence took effect before what came before it.
    let first_after = slots.iter().position(|&s| s > 10).unwrap();
    assert_eq!(first_after, 10, "an op crossed the fence: {slots:?}");
}

// ---------------------------------------------------------------- §7 generations

fn r38_a_lane_replaced_while_dirty_widens_the_flush_to_every_lane(over: Over) {
    let mut r = rig(over, 4, 1, Timing::NextPoll, 256);
    let ep = r.ep(0);
    all_ok(&r.run(&[r.put(0, 0, true, false)]));
    r.fault.bump_generation(DriverEp(0), 1);
    all_ok(&r.run(&[strong(ep), r.put(0, 1, true, true)]));
    assert_eq!(
        r.fault.flushes().iter().map(|f| f.1).collect::<Vec<_>>(),
        vec![0b1111]
    );
}

fn r39_a_lane_replaced_during_the_flush_is_flushed_again_before_the_epoch_moves(over: Over) {
    let mut r = rig(over, 4, 1, Timing::Delayed(3), 256);
    let ep = r.ep(0);
    r.submit(&[
        r.put(0, 0, true, false).with_user_data(0),
        strong(ep).with_user_data(1),
        r.put(0, 1, true, true).with_user_data(2),
    ]);
    let deadline = Instant::now() + HANG;
    while r.fault.flushes().is_empty() {
        r.initiator.progress();
        assert!(Instant::now() < deadline);
    }
    r.fault.bump_generation(DriverEp(0), 1);
    all_ok(&r.drain(3));
    let masks: Vec<u64> = r.fault.flushes().iter().map(|f| f.1).collect();
    assert_eq!(
        masks,
        vec![0b0010, 0b1111],
        "the replaced lane's flush is repeated, widened"
    );
    assert_eq!(r.byte_at(0, 1), 0xbb);
}

// ---------------------------------------------------------------- §8 close

fn r41_a_graceful_close_drains_flushes_and_completes_last(over: Over) {
    let mut r = rig(over, 4, 1, Timing::Delayed(2), 256);
    let ep = r.ep(0);
    let sqes = [
        r.put(0, 0, true, false),
        strong(ep),
        r.put(0, 1, true, true),
        Sqe::close(ep, CloseMode::GRACEFUL),
    ];
    let sqes = numbered(&sqes);
    r.submit(&sqes);
    let cqes = r.drain(4);
    all_ok(&cqes);
    assert_eq!(
        cqes.last().unwrap().user_data,
        3,
        "the close CQE comes last"
    );
    assert_eq!(r.byte_at(0, 1), 0xbb);
    // R43: nothing is accepted after a close.
    let after = r.run(&[r.put(0, 0, false, false), strong(ep)]);
    assert!(
        after
            .iter()
            .all(|c| c.res == Status::EndpointClosed.as_raw()),
        "{after:?}"
    );
}

fn r42_a_forced_close_cancels_the_queue_in_fifo_order(over: Over) {
    let mut r = rig(over, 4, 1, Timing::Delayed(50), 256);
    let ep = r.ep(0);
    let mut sqes = vec![r.put(0, 0, true, false), strong(ep)];
    sqes.extend((0..20).map(|k| r.put(0, 1 + k, true, true)));
    let sqes = numbered(&sqes);
    r.submit(&sqes);
    r.initiator.progress();
    r.submit(&[Sqe::close(ep, CloseMode::FORCE).with_user_data(999)]);
    let cqes = r.drain(sqes.len() + 1);
    // The deferred requests (after the fence) are purged with CANCELED, in
    // FIFO order; the posted one comes back through the driver.
    let canceled: Vec<u64> = cqes
        .iter()
        .filter(|c| c.res == Status::Canceled.as_raw() && c.user_data >= 2 && c.user_data < 999)
        .map(|c| c.user_data)
        .collect();
    assert_eq!(
        canceled,
        (2..22).collect::<Vec<_>>(),
        "queued requests canceled in FIFO order"
    );
    assert_eq!(cqes.iter().find(|c| c.user_data == 999).unwrap().res, 0);
    assert_eq!(
        r.run(&[r.put(0, 0, false, false)])[0].res,
        Status::EndpointClosed.as_raw()
    );
}

fn r44_dropping_the_worker_with_fence_work_outstanding_cancels_it_all(over: Over) {
    let mut r = rig(over, 4, 2, Timing::Delayed(100), 256);
    let mut sqes = Vec::new();
    for e in 0..2 {
        let ep = r.ep(e);
        sqes.extend([
            r.put(e, 0, true, false),
            strong(ep),
            r.put(e, 1, true, true),
            Sqe::flush(ep),
        ]);
    }
    let sqes = numbered(&sqes);
    r.submit(&sqes);
    r.initiator.progress();
    let Rig {
        initiator, mut qp, ..
    } = r;
    drop(initiator);
    let mut ids = Vec::new();
    while let Some(c) = qp.pop().unwrap() {
        ids.push(c.user_data);
    }
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..sqes.len() as u64).collect::<Vec<_>>(),
        "exactly once each"
    );
}

// ---------------------------------------------------------------- §9 ring

fn r47_cq_full_exactly_when_an_epoch_completes(over: Over) {
    // 16 CQ entries; 200 requests wait behind one fence and become ready in
    // the same round the flush completes.
    let mut r = rig(over, 4, 1, Timing::Delayed(4), 16);
    let ep = r.ep(0);
    let mut sqes = vec![r.put(0, 0, true, false), strong(ep)];
    sqes.extend((0..200).map(|k| r.put(0, 1 + k % 300, false, true)));
    let sqes = numbered(&sqes);
    r.submit(&sqes);
    for _ in 0..200 {
        r.initiator.progress();
    }
    assert!(r.qp.is_overflowed());
    let mut got = HashMap::new();
    let deadline = Instant::now() + HANG;
    while got.len() < sqes.len() {
        r.initiator.progress();
        while let Some(c) = r.qp.pop().unwrap() {
            assert!(
                got.insert(c.user_data, c.res).is_none(),
                "duplicate {}",
                c.user_data
            );
        }
        assert!(
            Instant::now() < deadline,
            "lost {} CQEs",
            sqes.len() - got.len()
        );
    }
    assert!(got.values().all(|&res| res >= 0));
}

// ---------------------------------------------------------------- W1-W6

/// Loopback only: a flush that finishes inside its own start needs a
/// driver that finishes flushes inside the call.
#[test]
fn w1_a_flush_that_completes_synchronously_inside_its_own_start() {
    let mut r = rig(Over::Loopback, 4, 1, Timing::Synchronous, 256);
    let ep = r.ep(0);
    let mut sqes = Vec::new();
    for k in 0..50 {
        sqes.extend([
            r.put(0, k, true, false),
            r.put(0, k + 100, true, false),
            strong(ep),
            r.put(0, k, true, true),
        ]);
    }
    all_ok(&r.run(&sqes));
    assert_eq!(
        r.fault.flushes().len(),
        50,
        "each boundary flushed once, inline"
    );
    assert_eq!(r.byte_at(0, 49), 0xbb);
}

fn w2_lanes_dirtied_after_a_flush_started_stay_dirty(over: Over) {
    let mut r = rig(over, 4, 1, Timing::Delayed(3), 256);
    let ep = r.ep(0);
    // Flush 1 covers lane 1 only; lane 2 is written after it started (by
    // the request it admits); flush 2 must cover lane 2, and not lane 1.
    all_ok(&r.run(&[
        r.put(0, 0, true, false),
        strong(ep),
        r.put(0, 1, true, true),
        strong(ep),
        r.put(0, 2, false, true),
    ]));
    assert_eq!(
        r.fault.flushes().iter().map(|f| f.1).collect::<Vec<_>>(),
        vec![0b0010, 0b0100]
    );
}

fn w3_deferral_and_back_pressure_never_surface_as_a_status(over: Over) {
    let mut r = rig(over, 3, 1, Timing::Delayed(2), 1024);
    r.fault.no_resource(25);
    let ep = r.ep(0);
    let sqes: Vec<Sqe> = (0..300)
        .map(|k| {
            if k % 7 == 3 {
                strong(ep)
            } else {
                r.put(0, k % 400, k % 2 == 0, true)
            }
        })
        .collect();
    let cqes = r.run(&sqes);
    for c in &cqes {
        assert!(c.res >= 0, "{}", ringfence_ring::strerror(c.res));
    }
}

fn w4_a_straggler_blocked_before_the_snapshot_is_covered(over: Over) {
    // The op before the fence is refused by the driver (NO_RESOURCE) when
    // it first tries; the boundary flush must not start without it (R17).
    for blocked in 1..5 {
        let mut r = rig(over, 3, 1, Timing::NextPoll, 256);
        r.fault.no_resource(blocked);
        let ep = r.ep(0);
        all_ok(&r.run(&[
            r.put(0, 0, true, false),
            strong(ep),
            r.put(0, 0, true, true),
        ]));
        let log = r.log();
        assert_eq!(log.len(), 2);
        assert_eq!(r.byte_at(0, 0), 0xbb, "blocked {blocked}: B overtook A");
    }
}

fn w5_the_first_error_is_the_one_source_of_truth(over: Over) {
    let mut r = rig(over, 3, 1, Timing::NextPoll, 256);
    r.fault.fail_flush(0, Status::Timeout);
    r.fault.fail_post(2, Status::Transport);
    let ep = r.ep(0);
    let cqes = r.run(&[
        r.put(0, 0, true, false),
        strong(ep),
        r.put(0, 1, true, true),
        r.put(0, 2, true, true),
    ]);
    assert_eq!(cqes[2].res, Status::Timeout.as_raw());
    assert_eq!(cqes[3].res, Status::Timeout.as_raw());
    // A later error does not replace the sticky first one.
    assert_eq!(
        r.run(&[r.put(0, 3, false, false)])[0].res,
        Status::Timeout.as_raw()
    );
}

// ---------------------------------------------------------------- model

// ------------------------------------------- findings of the adversarial suite

/// Progress until the injector has seen `n` flushes.
fn until_flushes(r: &Rig, n: usize) {
    let deadline = Instant::now() + HANG;
    while r.fault.flushes().len() < n {
        r.initiator.progress();
        assert!(Instant::now() < deadline, "flush {n} never started");
    }
}

/// The lane masks of every flush the injector saw.
fn flush_masks(r: &Rig) -> Vec<u64> {
    r.fault.flushes().iter().map(|f| f.1).collect()
}

/// Finding 1 (R8, R38): A is in flight on the one ordered lane; a weak
/// fence admits B on it, but the driver has no room for B; the lane is
/// replaced before B is posted again. The old channel's A is not ordered
/// with the new channel, so B must wait for a flush (of every lane, R38)
/// instead of riding on the fence flag alone.
fn r8_r38_a_lane_replaced_between_a_weak_fence_decision_and_its_post_takes_the_flush(over: Over) {
    // A takes long on the old channel; B would be quick on the new one.
    let mut r = rig(over, 1, 1, Timing::Delayed(20), 256);
    let ep = r.ep(0);
    r.submit(&[r.put(0, 0, false, false).with_user_data(0)]);
    r.initiator.progress(); // A is held by the injector
    r.fault.set_timing(Timing::NextPoll);
    // No room for B, for as long as it takes to replace the lane.
    r.fault.no_resource(u32::MAX);
    r.submit(&[
        weak(ep).with_user_data(1),
        r.put(0, 0, false, true).with_user_data(2),
    ]);
    r.initiator.progress(); // the weak decision; B refused
    let state = r.initiator.fence_state(r.eps[0].0).unwrap();
    assert_eq!(state.weak.map(|(lane, _)| lane), Some(0), "{state:?}");
    assert_eq!(state.deferred, 1, "{state:?}");
    r.fault
        .bump_generation(r.initiator.driver_endpoint(r.eps[0].0).unwrap(), 0);
    r.fault.no_resource(0);
    all_ok(&r.drain(3));
    assert_eq!(
        flush_masks(&r),
        vec![0b1],
        "B went out on the fence flag alone"
    );
    let s = r.stats(0);
    assert_eq!((s.weak_fences, s.fence_flushes), (1, 1), "{s:?}");
    assert_eq!(r.byte_at(0, 0), 0xbb);
}

/// Finding 3 (R25): a late duplicate of fence flush 1's completion arrives
/// while fence flush 2 is in flight. It names flush 1, so it is stray:
/// what follows fence 2 waits for flush 2, and the PUT after it lands
/// last, whatever the lanes' timing. (Over the asynchronous seam the inner
/// driver completes flushes, which the injector does not duplicate: there
/// the test checks the order alone.)
fn r25_a_duplicated_fence_flush_completion_does_not_end_the_next_flush(over: Over) {
    let mut r = rig(over, 3, 1, Timing::NextPoll, 256);
    let ep = r.ep(0);
    r.fault.duplicate_flush_completions(1);
    // Y (before fence 2) is slow on lane 2; Z (after it) quick on lane 1.
    r.fault.set_lane_timing(2, Timing::Delayed(20));
    all_ok(&r.run(&[
        r.put(0, 0, true, false), // lane 1
        strong(ep),
        r.put(0, 5, true, false), // Y, lane 2
        strong(ep),
        r.put(0, 5, true, true), // Z, lane 1, the same address
    ]));
    assert_eq!(flush_masks(&r), vec![0b010, 0b100]);
    assert_eq!(r.byte_at(0, 5), 0xbb, "Z landed before Y: {:?}", r.log());
    let state = r.initiator.fence_state(r.eps[0].0).unwrap();
    assert_eq!(state.submit_epoch, state.admitted_epoch, "{state:?}");
}

/// Finding 3 for user FLUSHes: a duplicate of a FLUSH's completion that
/// arrives after its request slot went to a PUT still in flight is stray;
/// the PUT completes when it has executed, once.
fn r25_a_duplicated_user_flush_completion_does_not_complete_the_next_request(over: Over) {
    let mut r = rig(over, 3, 1, Timing::NextPoll, 256);
    let ep = r.ep(0);
    r.fault.duplicate_flush_completions(1);
    r.submit(&[
        r.put(0, 0, true, false).with_user_data(0),
        Sqe::flush(ep).with_user_data(1),
    ]);
    let deadline = Instant::now() + HANG;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        r.initiator.progress();
        while let Some(c) = r.qp.pop().unwrap() {
            seen.push(c);
        }
        assert!(Instant::now() < deadline, "{seen:?}");
    }
    all_ok(&seen);
    // The FLUSH's slot is free now, its duplicate two polls away: the
    // next request takes the slot, and its PUT is held meanwhile.
    r.fault.set_lane_timing(1, Timing::Delayed(20));
    r.fault.set_lane_timing(2, Timing::Delayed(20));
    r.submit(&[r.put(0, 1, true, true).with_user_data(7)]);
    let cqe = r.drain(1);
    assert!(cqe[0].res == BIG as i32, "{cqe:?}");
    assert!(
        r.log()
            .iter()
            .any(|x| x.remote_addr == r.windows[0].addr() + SLOT),
        "the PUT completed before it executed"
    );
}

/// Finding 2 (W2, R17): a user FLUSH that completed cleans the lanes it
/// flushed, so the next fence needs no flush of them; a lane written while
/// the FLUSH was in flight stays dirty.
fn w2_a_completed_user_flush_cleans_the_lanes_it_flushed(over: Over) {
    let mut r = rig(over, 3, 1, Timing::NextPoll, 256);
    let ep = r.ep(0);
    all_ok(&r.run(&[
        r.put(0, 0, true, false),
        r.put(0, 1, true, false),
        Sqe::flush(ep),
    ]));
    let state = r.initiator.fence_state(r.eps[0].0).unwrap();
    assert_eq!(
        (state.dirty_lanes, state.covered_lanes),
        (0, 0),
        "{state:?}"
    );
    all_ok(&r.run(&[strong(ep), r.put(0, 2, true, true)]));
    assert_eq!(
        flush_masks(&r),
        vec![0b110],
        "the fence flushed clean lanes again"
    );
    let s = r.stats(0);
    assert_eq!(
        (s.user_flushes, s.fence_flushes, s.flushes),
        (1, 0, 1),
        "{s:?}"
    );

    // Lane 0 written again after the FLUSH started: dirty after it.
    r.fault.set_timing(Timing::Delayed(3));
    r.submit(&[
        r.put(0, 3, false, false).with_user_data(10),
        Sqe::flush(ep).with_user_data(11),
    ]);
    until_flushes(&r, 2);
    let state = r.initiator.fence_state(r.eps[0].0).unwrap();
    // Lane 0, and lane 1 (the big PUT after the fence).
    assert_eq!(state.covered_lanes, 0b011, "{state:?}");
    r.submit(&[r.put(0, 4, false, false).with_user_data(12)]);
    all_ok(&r.drain(3));
    let state = r.initiator.fence_state(r.eps[0].0).unwrap();
    assert_eq!(
        (state.dirty_lanes, state.covered_lanes),
        (0b001, 0),
        "{state:?}"
    );
    all_ok(&r.run(&[strong(ep), r.put(0, 5, true, true)]));
    assert_eq!(
        flush_masks(&r)[2..],
        [0b001],
        "lane 0 was written after the flush"
    );
}

/// Finding 2, the fast path: once a flush completed every outstanding
/// lane, the epochs fast-forward (R10), so C = W again.
fn r10_a_completed_flush_of_everything_fast_forwards_the_epochs(over: Over) {
    let mut r = rig(over, 2, 1, Timing::NextPoll, 256);
    let ep = r.ep(0);
    all_ok(&r.run(&[
        r.put(0, 0, false, false),
        weak(ep),
        r.put(0, 0, false, true),
    ]));
    let state = r.initiator.fence_state(r.eps[0].0).unwrap();
    assert!(state.submit_epoch > state.admitted_epoch, "{state:?}");
    assert!(state.weak.is_some(), "{state:?}");
    all_ok(&r.run(&[Sqe::flush(ep)]));
    let state = r.initiator.fence_state(r.eps[0].0).unwrap();
    assert_eq!(state.submit_epoch, state.admitted_epoch, "{state:?}");
    assert_eq!((state.weak, state.dirty_lanes), (None, 0), "{state:?}");
}

/// After a weak fence whose flag went out, the direct path serves the
/// endpoint again on the fenced lane (R8: the lane orders what follows),
/// and declines for another lane (a big PUT needs the flush). Loopback
/// only: the direct path runs operations inside the call.
#[test]
fn r8_the_direct_path_serves_an_endpoint_again_after_a_weak_fence() {
    let mut r = rig(Over::Loopback, 2, 1, Timing::Synchronous, 256);
    let ep = r.ep(0);
    all_ok(&r.run(&[
        r.put(0, 0, false, false),
        weak(ep),
        r.put(0, 0, false, true),
    ]));
    assert_eq!(r.stats(0).weak_fences, 1);
    let small = r.put(0, 1, false, true);
    assert_eq!(
        r.qp.try_now(&small),
        Some(Ok(8)),
        "the direct path declined"
    );
    let big = r.put(0, 2, true, true);
    assert_eq!(
        r.qp.try_now(&big),
        None,
        "another lane needs the strong path"
    );
    assert_eq!(r.byte_at(0, 1), 0xbb);
}

/// Finding 4: a driver that calls back into its worker (here `progress`
/// from inside `post`) gets a panic naming the rule, not a silent
/// deadlock.
#[test]
fn a_driver_that_reenters_its_worker_panics_with_a_message() {
    let hook: Hook = Arc::new(Mutex::new(None));
    let worker = Arc::new(
        Worker::builder()
            .driver(Reentrant {
                inner: Loopback::with_mode(CompletionMode::Immediate),
                hook: hook.clone(),
            })
            .ignore_env()
            .build()
            .unwrap(),
    );
    let target = Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .unwrap();
    let window = target.alloc_registered(64).unwrap();
    let ep = worker.connect(target.address()).unwrap();
    let rkey = worker
        .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = worker.alloc_registered(64).unwrap();
    let mut qp = worker.create_queue().unwrap();
    let w = worker.clone();
    *hook.lock().unwrap() = Some(Box::new(move || {
        w.progress();
    }));
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr(),
    };
    qp.push(Sqe::put(ep.as_raw(), src.local(0), remote, 8))
        .unwrap();
    qp.submit();
    let w = worker.clone();
    let panic = std::thread::spawn(move || w.progress())
        .join()
        .expect_err("re-entry went unnoticed");
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        message.contains("entered again") && message.contains("drivers must never call the engine"),
        "{message}"
    );
    // The panic left the round half done: the engine is not used again
    // (its teardown would run on that state).
    std::mem::forget(worker);
}

type Hook = Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>;

/// Loopback, whose `post` runs a hook once: a driver that breaks the
/// contract.
struct Reentrant {
    inner: Loopback,
    hook: Hook,
}

impl std::fmt::Debug for Reentrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reentrant")
    }
}

impl ringfence::Driver for Reentrant {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> ringfence::Capabilities {
        self.inner.capabilities()
    }
    fn attach(&mut self, ctx: ringfence::DriverContext) {
        self.inner.attach(ctx);
    }
    fn address(&self) -> Vec<u8> {
        self.inner.address()
    }
    fn connect(
        &mut self,
        peer: &[u8],
        lanes: u8,
        token: ringfence::Token,
    ) -> Result<ringfence::Connect, ringfence::DriverError> {
        self.inner.connect(peer, lanes, token)
    }
    fn disconnect(&mut self, ep: DriverEp) {
        self.inner.disconnect(ep);
    }
    fn register(
        &mut self,
        mem: &ringfence::MemDesc,
        prepared: ringfence::Prepared,
    ) -> Result<ringfence::Registered, ringfence::DriverError> {
        self.inner.register(mem, prepared)
    }
    fn deregister(&mut self, key: ringfence::DriverMemKey) {
        self.inner.deregister(key);
    }
    fn pack_rkey(&self, key: ringfence::DriverMemKey) -> Result<Vec<u8>, ringfence::DriverError> {
        self.inner.pack_rkey(key)
    }
    fn unpack_rkey(
        &mut self,
        ep: DriverEp,
        part: &ringfence::KeyPart<'_>,
        prepared: ringfence::Prepared,
    ) -> Result<ringfence::Unpacked, ringfence::DriverError> {
        self.inner.unpack_rkey(ep, part, prepared)
    }
    unsafe fn post(
        &mut self,
        ep: DriverEp,
        op: &ringfence::Op,
        token: ringfence::Token,
    ) -> ringfence::Posted {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.inner.post(ep, op, token) }
    }
    fn flush(&mut self, ep: DriverEp, lanes: u64, token: ringfence::Token) -> ringfence::Posted {
        self.inner.flush(ep, lanes, token)
    }
    fn poll(&mut self, out: &mut [ringfence::Completion]) -> usize {
        self.inner.poll(out)
    }
}

// ---------------------------------------------------------------- R26 worker flush

/// R26: a worker flush covers what every endpoint had submitted before
/// it, including requests deferred behind a fence flush in flight (R23),
/// and does not wait for what is submitted after it.
fn r26_a_worker_flush_covers_every_endpoint_mid_fence_and_not_later_work(over: Over) {
    let mut r = rig(over, 3, 2, Timing::Delayed(3), 256);
    let ep0 = r.ep(0);
    r.submit(&[
        r.put(0, 0, true, false).with_user_data(1),
        strong(ep0).with_user_data(2),
        r.put(0, 1, true, true).with_user_data(3), // deferred behind the fence flush
        r.put(1, 0, false, false).with_user_data(4),
        Sqe::flush_worker().with_user_data(5),
    ]);
    // The fence flush and the worker flush's part on endpoint 1.
    until_flushes(&r, 2);
    let state = r.initiator.fence_state(r.eps[0].0).unwrap();
    assert!(
        state.fence_flush.is_some() && state.deferred == 1,
        "{state:?}"
    );
    // Later work (a small PUT, lane 0) never lands; the deferred PUT of
    // endpoint 0 (a big one) keeps its lane's timing.
    r.fault.set_lane_timing(0, Timing::Delayed(1_000_000));
    r.submit(&[r.put(1, 1, false, true).with_user_data(6)]);
    let deadline = Instant::now() + HANG;
    let mut seen: Vec<Cqe> = Vec::new();
    while !seen.iter().any(|c| c.user_data == 5) {
        r.initiator.progress();
        while let Some(c) = r.qp.pop().unwrap() {
            seen.push(c);
        }
        assert!(Instant::now() < deadline, "the worker flush hung: {seen:?}");
    }
    all_ok(&seen);
    let landed: Vec<(u32, u64)> = r
        .log()
        .iter()
        .map(|x| {
            (
                x.ep.0,
                (x.remote_addr - r.windows[x.ep.0 as usize].addr()) / SLOT,
            )
        })
        .collect();
    for want in [(0, 0), (0, 1), (1, 0)] {
        assert!(
            landed.contains(&want),
            "{want:?} had not landed: {landed:?}"
        );
    }
    assert!(
        !landed.contains(&(1, 1)),
        "{landed:?} {:?}",
        r.fault.flushes()
    );
    assert_eq!(
        r.initiator.stats().worker_flushes,
        2,
        "one part per endpoint"
    );
}

/// R26 with a dead endpoint: a worker flush cannot promise the work a
/// failed endpoint holds unflushed, so it fails with that endpoint's
/// sticky error, until the endpoint is closed (R34); the other endpoint's
/// work is still flushed.
fn r26_r34_a_failed_endpoint_fails_worker_flushes_until_it_is_closed(over: Over) {
    let mut r = rig(over, 2, 2, Timing::NextPoll, 256);
    all_ok(&r.run(&[r.put(0, 0, false, false)]));
    r.fault.fail_next_on_lane(0, Status::Transport);
    let cqes = r.run(&[r.put(0, 1, false, false), r.put(1, 0, false, false)]);
    assert_eq!(cqes[0].res, Status::Transport.as_raw());
    let cqes = r.run(&[Sqe::flush_worker()]);
    assert_eq!(cqes[0].res, Status::Transport.as_raw());
    assert_eq!(
        r.stats(1).worker_flushes,
        1,
        "endpoint 1 was flushed anyway"
    );
    all_ok(&r.run(&[Sqe::close(r.ep(0), CloseMode::GRACEFUL)]));
    all_ok(&r.run(&[r.put(1, 1, false, false), Sqe::flush_worker()]));
}

/// R26: a worker flush with nothing outstanding anywhere completes at
/// once, without a driver flush; with no endpoint at all too.
fn r26_an_idle_worker_flush_completes_at_once(over: Over) {
    let mut r = rig(over, 2, 2, Timing::Delayed(5), 256);
    all_ok(&r.run(&[Sqe::flush_worker()]));
    assert!(r.fault.flushes().is_empty());
    // A named endpoint is refused: the field is reserved.
    let mut named = Sqe::flush_worker();
    named.endpoint = 1;
    let cqes = r.run(&[named]);
    assert_eq!(cqes[0].res, Status::InvalidEndpoint.as_raw());
    // Garbage in the fields a FLUSH does not use is refused, each field on
    // its own; the flush after them still completes.
    let noisy = Sqe::flush_worker();
    let cqes = r.run(&[
        Sqe {
            operand: u64::MAX,
            ..noisy
        },
        Sqe {
            operand2: 0xdead_beef,
            ..noisy
        },
        Sqe { len: 7, ..noisy },
    ]);
    assert!(
        cqes.iter()
            .all(|c| c.res == Status::InvalidArgument.as_raw()),
        "{cqes:?}"
    );
    all_ok(&r.run(&[r.put(0, 0, false, false), noisy]));
}

#[derive(Debug, Clone)]
enum Step {
    Put {
        ep: usize,
        big: bool,
    },
    Get {
        ep: usize,
    },
    Fadd {
        ep: usize,
    },
    Fence {
        ep: usize,
        strong: bool,
    },
    Flush {
        ep: usize,
    },
    /// A worker flush (R26).
    Quiet,
    /// A small PUT (slow), a weak fence and a small PUT the driver has no
    /// room for, then lane 0 replaced before that PUT is posted again (R8,
    /// R38).
    WeakThenReplace {
        ep: usize,
    },
    Notify {
        ep: usize,
    },
    FailNextPost(bool),
    FailNextFlush,
    NoResource(u8),
    Bump {
        ep: usize,
        lane: u8,
    },
    Progress(u8),
    Reap,
}

fn step() -> impl Strategy<Value = Step> {
    let ep = 0usize..2;
    prop_oneof![
        8 => (ep.clone(), any::<bool>()).prop_map(|(ep, big)| Step::Put { ep, big }),
        2 => ep.clone().prop_map(|ep| Step::Get { ep }),
        2 => ep.clone().prop_map(|ep| Step::Fadd { ep }),
        4 => (ep.clone(), any::<bool>()).prop_map(|(ep, strong)| Step::Fence { ep, strong }),
        2 => ep.clone().prop_map(|ep| Step::Flush { ep }),
        1 => Just(Step::Quiet),
        1 => ep.clone().prop_map(|ep| Step::WeakThenReplace { ep }),
        1 => ep.clone().prop_map(|ep| Step::Notify { ep }),
        1 => any::<bool>().prop_map(Step::FailNextPost),
        1 => Just(Step::FailNextFlush),
        1 => (1u8..4).prop_map(Step::NoResource),
        1 => (ep, 0u8..4).prop_map(|(ep, lane)| Step::Bump { ep, lane }),
        3 => (1u8..4).prop_map(Step::Progress),
        2 => Just(Step::Reap),
    ]
}

fn timing() -> impl Strategy<Value = Timing> {
    prop_oneof![
        Just(Timing::Synchronous),
        Just(Timing::NextPoll),
        (1u32..5).prop_map(Timing::Delayed),
        Just(Timing::Reordered),
    ]
}

fn sim_timing() -> impl Strategy<Value = SimTiming> {
    prop_oneof![
        (0u32..4).prop_map(SimTiming::Polls),
        (1u32..3, 0u32..6).prop_map(|(lo, extra)| SimTiming::PollsBetween(lo, lo + extra)),
    ]
}

/// What the model knows of one submitted request.
#[derive(Debug, Clone)]
struct Model {
    ep: usize,
    /// Fence boundaries (fences and NOTIFYs) before it on its endpoint.
    boundary: u64,
    /// A lane operation (PUT, GET, ATOMIC, NOTIFY) with this identity, else
    /// a FLUSH or a FENCE.
    op: Option<u64>,
    flush: bool,
    /// A worker flush: it covers both endpoints.
    quiet: bool,
}

fn run_model(
    over: Over,
    lanes: u8,
    unordered: u64,
    timing: Timing,
    seed: u64,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let mut r = rig(over, lanes, 2, timing, 64);
    r.fault.set_unordered(unordered);
    r.seed(seed);
    let mut target_qps: Vec<QueuePair> = r
        ._targets
        .iter()
        .map(|t| t.create_queue().unwrap())
        .collect();
    let mut model: Vec<Model> = Vec::new();
    let mut boundary = [0u64; 2];
    let mut cqes: HashMap<u64, i32> = HashMap::new();
    // For each FLUSH that succeeded: how many log entries existed when its
    // CQE was seen.
    let mut flush_seen: HashMap<u64, usize> = HashMap::new();
    let mut posts = 0u64;
    let mut flushes = 0u64;
    let reap = |r: &mut Rig,
                cqes: &mut HashMap<u64, i32>,
                flush_seen: &mut HashMap<u64, usize>,
                model: &[Model]|
     -> Result<(), TestCaseError> {
        while let Some(c) = r.qp.pop().unwrap() {
            prop_assert!(
                cqes.insert(c.user_data, c.res).is_none(),
                "second CQE for {}",
                c.user_data
            );
            let m = &model[c.user_data as usize];
            if (m.flush || m.quiet) && c.res >= 0 {
                flush_seen.insert(c.user_data, r.log().len());
            }
        }
        Ok(())
    };
    for s in steps {
        let id = model.len() as u64;
        let slot = 1 + id % 400;
        let sqe = match *s {
            Step::Put { ep, big } => Some((ep, r.put(ep, slot, big, true), true, false)),
            Step::Get { ep } => Some((
                ep,
                Sqe::get(r.ep(ep), r.src.local(2048), r.remote(ep, slot), 8),
                true,
                false,
            )),
            Step::Fadd { ep } => Some((
                ep,
                Sqe::atomic_fadd(r.ep(ep), r.src.local(3072), r.remote(ep, slot), 1),
                true,
                false,
            )),
            Step::Fence { ep, strong: s } => {
                boundary[ep] += 1;
                Some((
                    ep,
                    Sqe::fence(
                        r.ep(ep),
                        if s {
                            FenceMode::COMPLETE
                        } else {
                            FenceMode::ORDER
                        },
                    ),
                    false,
                    false,
                ))
            }
            Step::Flush { ep } => Some((ep, Sqe::flush(r.ep(ep)), false, true)),
            Step::Quiet => {
                model.push(Model {
                    ep: 0,
                    boundary: 0,
                    op: None,
                    flush: false,
                    quiet: true,
                });
                r.submit(&[Sqe::flush_worker().with_user_data(id)]);
                None
            }
            Step::WeakThenReplace { ep } => {
                // Three requests: model ids id, id + 1, id + 2.
                model.push(Model {
                    ep,
                    boundary: boundary[ep],
                    op: Some(id),
                    flush: false,
                    quiet: false,
                });
                // The first PUT is slow on the old channel, so that the
                // new channel could overtake it.
                r.fault.set_lane_timing(0, Timing::Delayed(8));
                r.submit(&[r.put(ep, slot, false, true).with_user_data(id)]);
                r.initiator.progress();
                r.fault.clear_lane_timing(0);
                boundary[ep] += 1;
                model.push(Model {
                    ep,
                    boundary: boundary[ep],
                    op: None,
                    flush: false,
                    quiet: false,
                });
                model.push(Model {
                    ep,
                    boundary: boundary[ep],
                    op: Some(id + 2),
                    flush: false,
                    quiet: false,
                });
                r.fault.no_resource(u32::MAX);
                r.submit(&[
                    Sqe::fence(r.ep(ep), FenceMode::ORDER).with_user_data(id + 1),
                    r.put(ep, 1 + (id + 2) % 400, false, true)
                        .with_user_data(id + 2),
                ]);
                r.initiator.progress();
                let driver_ep = r.initiator.driver_endpoint(r.eps[ep].0).unwrap();
                r.fault.bump_generation(driver_ep, 0);
                r.fault.no_resource(0);
                None
            }
            Step::Notify { ep } => {
                boundary[ep] += 1;
                let mut n = Sqe::notify(r.ep(ep), r.src.local(0), 4);
                n.operand = id;
                Some((ep, n, true, false))
            }
            Step::FailNextPost(fatal) => {
                r.fault.fail_post(
                    posts,
                    if fatal {
                        Status::Transport
                    } else {
                        Status::AccessDenied
                    },
                );
                None
            }
            Step::FailNextFlush => {
                r.fault.fail_flush(flushes, Status::Transport);
                None
            }
            Step::NoResource(n) => {
                r.fault.no_resource(u32::from(n));
                None
            }
            Step::Bump { ep, lane } => {
                r.fault.bump_generation(DriverEp(ep as u32), lane % lanes);
                None
            }
            Step::Progress(n) => {
                for _ in 0..n {
                    r.initiator.progress();
                    for (t, q) in r._targets.iter().zip(target_qps.iter_mut()) {
                        t.progress();
                        while let Some(c) = q.pop().unwrap() {
                            drop(q.notification(&c));
                        }
                    }
                }
                None
            }
            Step::Reap => {
                reap(&mut r, &mut cqes, &mut flush_seen, &model)?;
                None
            }
        };
        if let Some((ep, sqe, is_op, is_flush)) = sqe {
            model.push(Model {
                ep,
                boundary: boundary[ep],
                op: is_op.then_some(id),
                flush: is_flush,
                quiet: false,
            });
            r.submit(&[sqe.with_user_data(id)]);
            posts = r.log().len() as u64; // a rough cursor: injected failures hit a later post
            flushes = r.fault.flushes().len() as u64;
        }
    }
    let deadline = Instant::now() + HANG;
    while cqes.len() < model.len() {
        r.initiator.progress();
        for (t, q) in r._targets.iter().zip(target_qps.iter_mut()) {
            t.progress();
            while let Some(c) = q.pop().unwrap() {
                drop(q.notification(&c));
            }
        }
        reap(&mut r, &mut cqes, &mut flush_seen, &model)?;
        prop_assert!(
            Instant::now() < deadline,
            "{} of {} CQEs",
            cqes.len(),
            model.len()
        );
    }
    // Statuses: success, or an injected error, or the sticky error of an
    // endpoint failed by one.
    for (id, res) in &cqes {
        let ok = *res >= 0
            || [Status::Transport, Status::AccessDenied]
                .iter()
                .any(|s| s.as_raw() == *res);
        prop_assert!(ok, "{}: {}", id, ringfence_ring::strerror(*res));
    }
    // The order of effects at the targets respects every fence boundary.
    let log = r.log();
    let id_of = |x: &Executed| -> u64 {
        if x.kind == OpKind::Notify {
            x.operand
        } else {
            let e = x.ep.0 as usize;
            (x.remote_addr - r.windows[e].addr()) / SLOT
        }
    };
    // Map (endpoint, slot) -> model id for lane ops (slot = 1 + id % 400;
    // cases have fewer than 400 steps, so slots are unique).
    let by_slot: HashMap<(usize, u64), u64> = model
        .iter()
        .filter_map(|m| m.op.map(|id| ((m.ep, 1 + id % 400), id)))
        .collect();
    let mut position: HashMap<u64, usize> = HashMap::new();
    for (pos, x) in log.iter().enumerate() {
        let e = x.ep.0 as usize;
        let key = id_of(x);
        let id = if x.kind == OpKind::Notify {
            key
        } else {
            *by_slot.get(&(e, key)).unwrap_or(&u64::MAX)
        };
        if id != u64::MAX {
            position.entry(id).or_insert(pos);
        }
    }
    for a in &model {
        let Some(ida) = a.op else { continue };
        let Some(&pa) = position.get(&ida) else {
            continue;
        };
        for b in model
            .iter()
            .filter(|b| b.ep == a.ep && b.boundary < a.boundary)
        {
            let Some(idb) = b.op else { continue };
            if let Some(&pb) = position.get(&idb) {
                prop_assert!(
                    pb < pa,
                    "op {} (boundary {}) took effect before op {} (boundary {})",
                    ida,
                    a.boundary,
                    idb,
                    b.boundary
                );
            } else if cqes.get(&idb).is_some_and(|&res| res >= 0) {
                prop_assert!(false, "op {} succeeded but never took effect", idb);
            }
        }
    }
    // A successful FLUSH saw every earlier successful op of its endpoint; a
    // successful worker flush, of every endpoint (R26).
    for (fid, &len) in &flush_seen {
        let f = &model[*fid as usize];
        for b in model[..*fid as usize]
            .iter()
            .filter(|b| f.quiet || b.ep == f.ep)
        {
            let Some(idb) = b.op else { continue };
            if cqes.get(&idb).is_some_and(|&res| res >= 0) {
                let p = position.get(&idb).copied().unwrap_or(usize::MAX);
                prop_assert!(
                    p < len,
                    "FLUSH {} completed before op {} took effect",
                    fid,
                    idb
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(debug_assertions) { 2000 } else { 10000 },
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn model_fence_boundaries_hold_over_faulty_lanes(
        lanes in 1u8..=4,
        unordered in 0u64..16,
        timing in timing(),
        seed in any::<u64>(),
        steps in prop::collection::vec(step(), 1..130),
    ) {
        run_model(Over::Loopback, lanes, unordered, timing, seed, &steps)?;
    }
}

proptest! {
    // The same model over the asynchronous seam: fewer cases (each runs
    // more rounds), the simulated driver's timing and seed drawn too.
    #![proptest_config(ProptestConfig {
        cases: if cfg!(debug_assertions) { 500 } else { 3000 },
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn model_fence_boundaries_hold_over_faulty_lanes_on_the_async_seam(
        lanes in 1u8..=4,
        unordered in 0u64..16,
        timing in timing(),
        sim_timing in sim_timing(),
        seed in any::<u64>(),
        steps in prop::collection::vec(step(), 1..130),
    ) {
        run_model(Over::Sim(sim_timing), lanes, unordered, timing, seed, &steps)?;
    }
}

/// Runs of PUTs reach the driver through `DirectPath::execute` (here the
/// injector's, which runs each through its faults): an injected failure in
/// the middle of a run ends the run there; a non-fatal one fails only that
/// PUT, a fatal one (R20, R32) fails the endpoint, and every later SQE of
/// the batch completes with the sticky error. NO_RESOURCE in the middle of
/// a run leaves the rest to the one-at-a-time path. Every SQE gets exactly
/// one CQE, and the log shows what ran, in order. Loopback only: runs go
/// through `DirectPath::execute`, which only drivers that finish operations
/// inside the call offer.
#[test]
fn r31_r32_a_failure_in_the_middle_of_a_run_of_puts() {
    let mut r = rig(Over::Loopback, 1, 1, Timing::Synchronous, 256);
    let puts = |r: &Rig, from: u64| -> Vec<Sqe> {
        (0..20).map(|k| r.put(0, from + k, false, false)).collect()
    };

    // Post number 5 is refused at the target (not fatal).
    r.fault.fail_post(5, Status::AccessDenied);
    let cqes = r.run(&puts(&r, 0));
    let failed: Vec<u64> = cqes
        .iter()
        .filter(|c| c.res < 0)
        .map(|c| c.user_data)
        .collect();
    assert_eq!(failed, vec![5]);
    assert_eq!(cqes[5].res, Status::AccessDenied.as_raw());
    assert_eq!(r.log().len(), 19, "all but the refused PUT ran");

    // Back-pressure for the next two posts: the run stops, the rest is
    // posted one by one, and all of it lands.
    r.fault.no_resource(2);
    all_ok(&r.run(&puts(&r, 20)));
    assert_eq!(r.log().len(), 39);

    // A fatal failure at post 45 (the 6th PUT of this batch): the endpoint
    // fails, and nothing after it runs.
    r.fault.fail_post(45, Status::Transport);
    let cqes = r.run(&puts(&r, 40));
    for c in &cqes {
        let want = if c.user_data < 5 {
            8
        } else {
            Status::Transport.as_raw()
        };
        assert_eq!(c.res, want, "{c:?}");
    }
    assert_eq!(r.log().len(), 44, "nothing ran after the fatal failure");
    // The worker counts every SQE; the endpoint those that reached it (the
    // 14 refused at submission by its sticky error are the worker's alone).
    let stats = r.initiator.stats();
    assert_eq!((stats.ops, stats.errors), (60, 16), "{stats:?}");
    let stats = r.stats(0);
    assert_eq!((stats.ops, stats.errors), (46, 2), "{stats:?}");
}

/// Each body above that takes an `Over` runs as two tests: over the
/// injector on loopback, and over the injector on the asynchronous seam,
/// where each operation and flush completes 1 to 4 polls after its commit.
macro_rules! over_both {
    ($($name:ident),* $(,)?) => {
        mod over_loopback {
            $(
                #[test]
                fn $name() {
                    super::$name(super::Over::Loopback);
                }
            )*
        }
        mod over_sim {
            $(
                #[test]
                fn $name() {
                    super::$name(super::Over::Sim(super::SimTiming::PollsBetween(1, 4)));
                }
            )*
        }
    };
}

over_both!(
    r5_a_fence_completes_at_once_and_orders,
    r7_put_fence_put_same_address_across_unordered_lanes_ends_with_b,
    r8_weak_fence_on_one_ordered_lane_is_a_fence_flag_not_a_flush,
    r9_strong_fence_flushes_exactly_the_dirty_lanes,
    r10_a_fence_with_nothing_outstanding_is_free,
    r11_a_fence_storm_collapses_into_one_boundary,
    r13_r16_r18_later_requests_wait_in_order_behind_the_one_flush_in_flight,
    r16_r45_other_endpoints_keep_flowing_while_one_waits_on_its_flush,
    r21_r23_a_user_flush_covers_deferred_requests_and_not_later_ones,
    r24_an_empty_flush_completes_at_once_without_the_driver,
    r27_r29_atomics_join_epochs_add_fence_fadd_sees_every_add,
    r33_error_during_an_in_flight_fence_flush_with_1000_deferred_requests,
    r31_r35_a_failed_post_completes_once_and_only_that_operation_fails,
    r19_no_resource_sends_the_head_back_to_the_head_of_the_queue,
    r38_a_lane_replaced_while_dirty_widens_the_flush_to_every_lane,
    r39_a_lane_replaced_during_the_flush_is_flushed_again_before_the_epoch_moves,
    r41_a_graceful_close_drains_flushes_and_completes_last,
    r42_a_forced_close_cancels_the_queue_in_fifo_order,
    r44_dropping_the_worker_with_fence_work_outstanding_cancels_it_all,
    r47_cq_full_exactly_when_an_epoch_completes,
    w2_lanes_dirtied_after_a_flush_started_stay_dirty,
    w3_deferral_and_back_pressure_never_surface_as_a_status,
    w4_a_straggler_blocked_before_the_snapshot_is_covered,
    w5_the_first_error_is_the_one_source_of_truth,
    r8_r38_a_lane_replaced_between_a_weak_fence_decision_and_its_post_takes_the_flush,
    r25_a_duplicated_fence_flush_completion_does_not_end_the_next_flush,
    r25_a_duplicated_user_flush_completion_does_not_complete_the_next_request,
    w2_a_completed_user_flush_cleans_the_lanes_it_flushed,
    r10_a_completed_flush_of_everything_fast_forwards_the_epochs,
    r26_a_worker_flush_covers_every_endpoint_mid_fence_and_not_later_work,
    r26_an_idle_worker_flush_completes_at_once,
    r26_r34_a_failed_endpoint_fails_worker_flushes_until_it_is_closed,
);
