//! R26, the worker flush: it covers every endpoint (mid-fence too) and not
//! later work, fails while an endpoint is failed, and is free when idle.

use crate::{HANG, Over, SLOT, all_ok, rig, strong, until_flushes};
use ringfence_ring::{CloseMode, Cqe, Sqe, Status};
use ringfence_testkit::Timing;
use std::time::Instant;

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

over_both!(
    r26_a_worker_flush_covers_every_endpoint_mid_fence_and_not_later_work,
    r26_an_idle_worker_flush_completes_at_once,
    r26_r34_a_failed_endpoint_fails_worker_flushes_until_it_is_closed,
);
