//! §7 lane generations (R38, R39): a lane replaced while dirty, during a
//! flush, or between a weak fence's decision and its post.

use crate::{HANG, Over, all_ok, flush_masks, rig, strong, weak};
use ringfence::DriverEp;
use ringfence_testkit::Timing;
use std::time::Instant;

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

over_both!(
    r38_a_lane_replaced_while_dirty_widens_the_flush_to_every_lane,
    r39_a_lane_replaced_during_the_flush_is_flushed_again_before_the_epoch_moves,
    r8_r38_a_lane_replaced_between_a_weak_fence_decision_and_its_post_takes_the_flush,
);
