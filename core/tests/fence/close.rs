//! §8 close and teardown (R41–R44): graceful and forced close, and dropping
//! the worker with fence work outstanding.

use crate::{Over, Rig, all_ok, numbered, rig, strong};
use ringfence_ring::{CloseMode, Sqe, Status};
use ringfence_testkit::Timing;

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

over_both!(
    r41_a_graceful_close_drains_flushes_and_completes_last,
    r42_a_forced_close_cancels_the_queue_in_fifo_order,
    r44_dropping_the_worker_with_fence_work_outstanding_cancels_it_all,
);
