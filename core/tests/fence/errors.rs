//! §6 errors and exactly once (R19, R31–R35): a failure during a fence
//! flush, a failed post, back-pressure, and failures in a run of PUTs.

use crate::{Over, Rig, SLOT, all_ok, numbered, rig, strong};
use ringfence_ring::{Cqe, Sqe, Status};
use ringfence_testkit::Timing;

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

over_both!(
    r33_error_during_an_in_flight_fence_flush_with_1000_deferred_requests,
    r31_r35_a_failed_post_completes_once_and_only_that_operation_fails,
    r19_no_resource_sends_the_head_back_to_the_head_of_the_queue,
);
