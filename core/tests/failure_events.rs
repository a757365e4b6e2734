//! Failure events from the driver ([`Fails`]): a completion that names its
//! endpoint's cause, the operations lost after it, and operations lost
//! with a lane the driver replaced. Driven by a `FaultInjector` that
//! kills an endpoint the way an error kills an RC queue pair (the failing
//! work request, then every later one flushed) and that replaces a lane
//! losing what its old channel held.
//!
//! Deterministic on a loaded machine: nothing sleeps to synchronize, no
//! assertion is about time; loops are bounded by a generous deadline that
//! only catches hangs.

use ringfence::{
    CompletionMode, EndpointId, EndpointState, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker,
};
use ringfence_ring::{Cqe, FenceMode, RemoteBuf, Sqe, Status};
use ringfence_testkit::{FaultHandle, FaultInjector, LoopbackTarget, Timing, Wait, run_sqes};

struct Rig {
    _target: Worker,
    w: Worker,
    fault: FaultHandle,
    window: RegisteredBuf,
    src: RegisteredBuf,
    id: EndpointId,
    rkey: RkeyId,
    qp: QueuePair,
}

/// An initiator over a `FaultInjector` (completing at the next poll) with
/// one 2-lane endpoint to a loopback target.
fn rig() -> Rig {
    let (driver, fault) = FaultInjector::new(Loopback::with_mode(CompletionMode::Immediate));
    fault.set_timing(Timing::NextPoll);
    let w = Worker::builder()
        .driver(driver)
        .ignore_env()
        .build()
        .unwrap();
    let LoopbackTarget {
        worker: target,
        window,
        ep: id,
        rkey,
    } = LoopbackTarget::connect(&w, 4096);
    let src = w.alloc_registered(4096).unwrap();
    src.write(0, &[7; 64]);
    let qp = w.create_queue().unwrap();
    Rig {
        _target: target,
        w,
        fault,
        window,
        src,
        id,
        rkey,
        qp,
    }
}

impl Rig {
    fn put(&self, dst: u64, user_data: u64) -> Sqe {
        let remote = RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.window.addr() + dst,
        };
        Sqe::put(self.id.as_raw(), self.src.local(0), remote, 8).with_user_data(user_data)
    }

    /// Pushes `sqes` and progresses until `n` CQEs came, and no more
    /// (`run_sqes`); returns them.
    fn run(&mut self, sqes: &[Sqe], n: usize) -> Vec<Cqe> {
        run_sqes(&self.w, &mut self.qp, sqes, n)
    }
}

fn res(cqes: &[Cqe], user_data: u64) -> i32 {
    let mine: Vec<&Cqe> = cqes.iter().filter(|c| c.user_data == user_data).collect();
    assert_eq!(mine.len(), 1, "exactly one CQE for {user_data}: {cqes:?}");
    mine[0].res
}

/// An RC queue pair's remote access error: the second PUT fails with
/// `AccessDenied` (a status that alone fails only the operation) and
/// names it as the endpoint's cause; the PUTs behind it are flushed as
/// lost (`Canceled`, a status that alone would fail the endpoint). The
/// endpoint fails with the first real cause, `AccessDenied`, not with the
/// flush errors after it; each PUT completes once, the lost ones with the
/// sticky cause, and the PUT before the error succeeds.
#[test]
fn the_first_real_cause_is_the_sticky_status_not_the_flush_errors_after_it() {
    let mut r = rig();
    r.fault
        .kill_endpoint_on_post(1, Status::AccessDenied, Status::AccessDenied);
    let sqes: Vec<Sqe> = (0..4).map(|i| r.put(8 * i, i)).collect();
    let cqes = r.run(&sqes, 4);
    let denied = Status::AccessDenied.as_raw();
    assert_eq!(res(&cqes, 0), 8);
    assert_eq!(res(&cqes, 1), denied);
    assert_eq!(res(&cqes, 2), denied, "lost: the endpoint's cause");
    assert_eq!(res(&cqes, 3), denied, "lost: the endpoint's cause");
    assert_eq!(
        r.w.endpoint_state(r.id).unwrap(),
        EndpointState::Failed(Status::AccessDenied)
    );
    // Later work fails with the same sticky cause, at once.
    let later = r.run(&[r.put(0, 9)], 1);
    assert_eq!(res(&later, 9), denied);
}

/// A driver that names a cause other than the operation's own status:
/// the operation keeps its status, the endpoint fails with the cause.
#[test]
fn an_endpoint_cause_differs_from_the_operation_status() {
    let mut r = rig();
    r.fault
        .kill_endpoint_on_post(0, Status::AccessDenied, Status::Transport);
    let cqes = r.run(&[r.put(0, 1), r.put(8, 2)], 2);
    assert_eq!(res(&cqes, 1), Status::AccessDenied.as_raw());
    assert_eq!(res(&cqes, 2), Status::Transport.as_raw());
    assert_eq!(
        r.w.endpoint_state(r.id).unwrap(),
        EndpointState::Failed(Status::Transport)
    );
}

/// Operations lost with a replaced lane fail alone (`Canceled`, which by
/// status would fail the endpoint): the endpoint stays up, and a later
/// PUT, a strong fence and a FLUSH over the new generation succeed.
#[test]
fn operations_lost_on_a_replaced_lane_fail_alone() {
    let mut r = rig();
    r.fault.set_timing(Timing::Delayed(1000));
    r.qp.push_batch(&[r.put(0, 1), r.put(8, 2)]).unwrap();
    r.qp.submit();
    // Posted, held by the injector (they complete at the next poll).
    r.w.progress();
    let ep = r.w.driver_endpoint(r.id).unwrap();
    r.fault.replace_lane_losing(ep, 0);
    let cqes = r.run(&[], 2);
    r.fault.set_timing(Timing::NextPoll);
    let canceled = Status::Canceled.as_raw();
    assert_eq!((res(&cqes, 1), res(&cqes, 2)), (canceled, canceled));
    assert_eq!(r.w.endpoint_state(r.id).unwrap(), EndpointState::Connected);
    let later = r.run(
        &[
            r.put(16, 3),
            Sqe::fence(r.id.as_raw(), FenceMode::COMPLETE).with_user_data(4),
            r.put(24, 5),
            Sqe::flush(r.id.as_raw()).with_user_data(6),
        ],
        4,
    );
    for (u, want) in [(3, 8), (4, 0), (5, 8), (6, 0)] {
        assert_eq!(res(&later, u), want, "{later:?}");
    }
    assert_eq!(r.window.load_u64(16), u64::from_le_bytes([7; 8]));
    assert_eq!(r.w.endpoint_state(r.id).unwrap(), EndpointState::Connected);
}

/// A fence's flush lost with a replaced lane is started again over every
/// lane rather than failing the endpoint, and the PUT behind the fence
/// runs only after it.
#[test]
fn a_fence_flush_lost_on_a_replaced_lane_is_flushed_again() {
    let mut r = rig();
    r.run(&[r.put(0, 1)], 1);
    r.fault.block_flushes(true);
    r.qp.push_batch(&[
        r.put(8, 2),
        Sqe::fence(r.id.as_raw(), FenceMode::COMPLETE).with_user_data(3),
        r.put(16, 4),
    ])
    .unwrap();
    r.qp.submit();
    let mut cqes = Vec::new();
    for _ in 0..20 {
        r.w.progress();
        while let Some(c) = r.qp.pop().unwrap() {
            cqes.push(c);
        }
    }
    assert!(!cqes.iter().any(|c| c.user_data == 4), "{cqes:?}");
    let flushes = r.fault.flushes().len();
    // The held fence flush is lost with a killed channel: complete it as
    // lost while the endpoint is up.
    let ep = r.w.driver_endpoint(r.id).unwrap();
    r.fault.replace_lane_losing(ep, 0);
    r.fault.lose_held_flushes(ep);
    r.fault.block_flushes(false);
    cqes.extend(r.run(&[], 3 - cqes.len()));
    assert_eq!(res(&cqes, 4), 8, "{cqes:?}");
    assert!(
        r.fault.flushes().len() > flushes,
        "the fence flush was started again"
    );
    assert_eq!(r.w.endpoint_state(r.id).unwrap(), EndpointState::Connected);
}

/// A flush split over two drivers' lanes, whose part on `b` names the
/// endpoint dead while `a`'s part is held back (a peer that will never
/// answer): the endpoint fails with `b`'s cause at once, without waiting
/// for `a`'s part; the FLUSH completes once, when that part comes back,
/// with the failed part's own status.
#[test]
fn a_split_flush_part_that_names_its_endpoint_dead_fails_it_at_once() {
    const BIG: u32 = 1024;
    let (a_driver, a) = FaultInjector::new(Loopback::new().named("a"));
    let (b_driver, b) = FaultInjector::new(Loopback::new().named("b"));
    let w = Worker::builder()
        .driver(a_driver)
        .driver(b_driver)
        .bw_threshold(BIG)
        .ignore_env()
        .build()
        .unwrap();
    let target = LoopbackTarget::connect_mixed(&w, &[("a", 1), ("b", 1)], 8192);
    let (id, rkey, window) = (target.ep, target.rkey, &target.window);
    let src = w.alloc_registered(8192).unwrap();
    let mut qp = w.create_queue().unwrap();
    let put = |len: u32, user_data: u64| {
        let remote = RemoteBuf {
            rkey: rkey.as_raw(),
            addr: window.addr(),
        };
        Sqe::put(id.as_raw(), src.local(0), remote, len).with_user_data(user_data)
    };
    a.block_flushes(true);
    b.kill_endpoint_on_flush(0, Status::Transport, Status::AccessDenied);
    // A small PUT takes a's lane, a large one b's: the FLUSH has a part on
    // each driver.
    qp.push_batch(&[
        put(8, 1),
        put(2 * BIG, 2),
        Sqe::flush(id.as_raw()).with_user_data(3),
    ])
    .unwrap();
    qp.submit();
    let mut wait = Wait::new("the endpoint's failure, then the FLUSH");
    let mut cqes = Vec::new();
    while w.endpoint_state(id).unwrap() != EndpointState::Failed(Status::AccessDenied) {
        w.progress();
        while let Some(c) = qp.pop().unwrap() {
            cqes.push(c);
        }
        wait.round(false, || format!("{cqes:?}"));
    }
    assert_eq!(res(&cqes, 1), 8);
    assert_eq!(res(&cqes, 2), 2 * BIG as i32);
    assert!(
        cqes.iter().all(|c| c.user_data != 3),
        "the FLUSH waits for a's part: {cqes:?}"
    );
    assert!(a.held() > 0, "a's part is still held");
    a.block_flushes(false);
    while cqes.len() < 3 {
        w.progress();
        while let Some(c) = qp.pop().unwrap() {
            cqes.push(c);
        }
        wait.round(false, || format!("{cqes:?}"));
    }
    // Its own part's status, as a failing operation keeps its own (the
    // endpoint's cause is the sticky status).
    assert_eq!(res(&cqes, 3), Status::Transport.as_raw(), "{cqes:?}");
    for _ in 0..10 {
        w.progress();
    }
    assert_eq!(qp.pop().unwrap(), None, "one CQE per SQE");
}
