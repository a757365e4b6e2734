//! §3 epochs and admission (R13–R18, R45): later requests wait in order
//! behind the one flush in flight, other endpoints keep flowing, and a flush
//! of everything fast-forwards the epochs.

use crate::{Over, SLOT, all_ok, rig, strong, weak};
use ringfence_ring::Sqe;
use ringfence_testkit::{Executed, Timing};

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

over_both!(
    r13_r16_r18_later_requests_wait_in_order_behind_the_one_flush_in_flight,
    r16_r45_other_endpoints_keep_flowing_while_one_waits_on_its_flush,
    r10_a_completed_flush_of_everything_fast_forwards_the_epochs,
);
