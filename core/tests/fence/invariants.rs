//! The review warnings W1–W5 (docs/fence.md §10, the invariants the engine
//! keeps), one named test each.

use crate::{Over, all_ok, rig, strong};
use ringfence_ring::{Sqe, Status};
use ringfence_testkit::Timing;

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

over_both!(
    w2_lanes_dirtied_after_a_flush_started_stay_dirty,
    w3_deferral_and_back_pressure_never_surface_as_a_status,
    w4_a_straggler_blocked_before_the_snapshot_is_covered,
    w5_the_first_error_is_the_one_source_of_truth,
);
