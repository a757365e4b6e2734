//! §4 user FLUSH (R21–R25, W2): what a FLUSH covers, an empty one, stray
//! duplicates of flush completions, and the lanes a completed FLUSH cleans.

use crate::{BIG, HANG, Over, SLOT, all_ok, flush_masks, rig, strong, until_flushes};
use ringfence_ring::{Cqe, Sqe};
use ringfence_testkit::Timing;
use std::time::Instant;

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

over_both!(
    r21_r23_a_user_flush_covers_deferred_requests_and_not_later_ones,
    r24_an_empty_flush_completes_at_once_without_the_driver,
    r25_a_duplicated_fence_flush_completion_does_not_end_the_next_flush,
    r25_a_duplicated_user_flush_completion_does_not_complete_the_next_request,
    w2_a_completed_user_flush_cleans_the_lanes_it_flushed,
);
