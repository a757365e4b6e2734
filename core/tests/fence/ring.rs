//! §9 the ring (R47): the CQ is full exactly when an epoch completes.

use crate::{HANG, Over, numbered, rig, strong};
use ringfence_testkit::Timing;
use std::collections::HashMap;
use std::time::Instant;

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

over_both!(r47_cq_full_exactly_when_an_epoch_completes,);
