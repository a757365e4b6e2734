//! §2 fences (R5–R11): a fence completes at once and orders; a weak fence is
//! a flag on one ordered lane, a strong one flushes exactly the dirty lanes;
//! fences with nothing outstanding are free, and a storm is one boundary.

use crate::{Over, all_ok, numbered, rig, rig_unordered, strong, weak};
use ringfence_testkit::Timing;

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
            let mut r = rig_unordered(over, 3, 1, Timing::Reordered, 256, 0b110);
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
    let mut r = rig_unordered(over, 1, 1, Timing::NextPoll, 256, 0b1);
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

over_both!(
    r5_a_fence_completes_at_once_and_orders,
    r7_put_fence_put_same_address_across_unordered_lanes_ends_with_b,
    r8_weak_fence_on_one_ordered_lane_is_a_fence_flag_not_a_flush,
    r9_strong_fence_flushes_exactly_the_dirty_lanes,
    r10_a_fence_with_nothing_outstanding_is_free,
    r11_a_fence_storm_collapses_into_one_boundary,
);
