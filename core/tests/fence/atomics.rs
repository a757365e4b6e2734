//! §5 atomics (R27–R29): atomics join epochs; add, fence, fetch-add sees
//! every add.

use crate::{BIG, Over, all_ok, rig_unordered};
use ringfence_ring::{FenceMode, Sqe};
use ringfence_testkit::Timing;

fn r27_r29_atomics_join_epochs_add_fence_fadd_sees_every_add(over: Over) {
    // UCX's test_ucp_fence: add, fence, fetch-add, 500 times; the fetched
    // value must be i + 1. Atomics use the last lane; the lanes are
    // unordered and shuffled, so only the fence can order the add before the
    // fetch-add (R27, R28); the fetched value is valid at the CQE (R29).
    for mode in [FenceMode::COMPLETE, FenceMode::ORDER] {
        let mut r = rig_unordered(over, 3, 1, Timing::Reordered, 256, 0b111);
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

over_both!(r27_r29_atomics_join_epochs_add_fence_fadd_sees_every_add,);
