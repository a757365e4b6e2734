//! Connecting: SQEs queued behind a handshake that fails or succeeds, a
//! worker dropped while it runs, and what each kind of queued SQE completes
//! with when it fails.

use crate::{BIG, SLOT, initiator, is_fence, mixed, run, target};
use ringfence::{DriverEp, EndpointState};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe, Status};
use ringfence_testkit::{SimEvent, SimTiming};
use std::time::Duration;

/// (a) docs/fence.md R18, R20, R32: a handshake that fails after M polls, with
/// 100 SQEs queued on the connecting endpoint (weak and strong fences
/// among them). Nothing reaches the driver; every SQE completes exactly
/// once; everything queued completes with the handshake's error, in
/// submission order. A FENCE completes at once when submitted (R5: it
/// orders, it completes nothing; R34: one on a failed endpoint is
/// accepted), so its CQE is a success, before the queue's.
#[test]
fn a_connect_that_fails_completes_every_queued_sqe_once_with_its_error_in_order() {
    let (t, window) = target(100 * 4 * SLOT as usize);
    let (w, sim) = initiator(4);
    sim.connect_polls(5);
    sim.fail_connect(Status::PeerUnreachable);
    let ep = w.connect(t.address()).unwrap();
    assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connecting);
    // The handle is good for unpacking keys while the handshake runs.
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(32 * 1024).unwrap();
    let mut qp = w.create_queue().unwrap();
    let sqes = mixed(ep, rkey, window.addr(), &src);
    qp.push_batch(&sqes).unwrap();
    qp.submit();
    // Polls 1..4: still connecting, nothing posted.
    for _ in 0..4 {
        w.progress();
        assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connecting);
    }
    let cqes = run(&w, &mut qp, &[], sqes.len());
    assert_eq!(
        w.endpoint_state(ep).unwrap(),
        EndpointState::Failed(Status::PeerUnreachable)
    );
    let mut ids: Vec<u64> = cqes.iter().map(|c| c.user_data).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..100).collect::<Vec<_>>(), "exactly once each");
    let failed: Vec<u64> = cqes
        .iter()
        .filter(|c| !is_fence(&sqes[c.user_data as usize]))
        .map(|c| {
            assert_eq!(
                c.res,
                Status::PeerUnreachable.as_raw(),
                "SQE {}",
                c.user_data
            );
            c.user_data
        })
        .collect();
    assert_eq!(failed.len(), 80);
    assert!(
        failed.windows(2).all(|p| p[0] < p[1]),
        "purged out of submission order: {failed:?}"
    );
    for c in cqes
        .iter()
        .filter(|c| is_fence(&sqes[c.user_data as usize]))
    {
        assert_eq!(c.res, 0, "FENCE {} (R5)", c.user_data);
    }
    assert!(sim.log().is_empty(), "something executed: {:?}", sim.log());
    assert_eq!(
        sim.stats().posted,
        0,
        "nothing may be posted while connecting"
    );
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    assert!(sim.events().contains(&SimEvent::Connected(
        DriverEp(0),
        Err(Status::PeerUnreachable)
    )));
    // Sticky: a later SQE fails at once with the same error.
    let later = run(&w, &mut qp, &[sqes[0].with_user_data(500)], 1);
    assert_eq!(later[0].res, Status::PeerUnreachable.as_raw());
    let mut all = vec![0u8; 100 * 4 * SLOT as usize];
    window.read(0, &mut all);
    assert!(all.iter().all(|&b| b == 0), "nothing landed");
}

/// (a) The handshake succeeds after M polls with 100 SQEs queued: nothing
/// executes before it has, then they run in order under the fence rules
/// (R14, R18) and their data lands.
#[test]
fn a_connect_that_succeeds_runs_the_queued_sqes_in_order() {
    let (t, window) = target(100 * 4 * SLOT as usize);
    let (w, sim) = initiator(4);
    sim.connect_polls(5);
    sim.set_timing(SimTiming::Polls(3));
    sim.seed(11);
    let ep = w.connect(t.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(32 * 1024).unwrap();
    for i in 0..100u64 {
        src.write((u64::from(BIG) * i) as usize, &[i as u8 + 1; BIG as usize]);
    }
    let mut qp = w.create_queue().unwrap();
    let sqes = mixed(ep, rkey, window.addr(), &src);
    qp.push_batch(&sqes).unwrap();
    qp.submit();
    for _ in 0..4 {
        w.progress();
        assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connecting);
        assert_eq!(sim.stats().posted, 0, "posted while connecting");
    }
    let cqes = run(&w, &mut qp, &[], sqes.len());
    assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connected);
    for c in &cqes {
        assert!(
            c.res >= 0,
            "{}: {}",
            c.user_data,
            ringfence_ring::strerror(c.res)
        );
    }
    // The data landed: each PUT wrote its own slot with its pattern.
    for (i, sqe) in sqes.iter().enumerate() {
        if sqe.opcode != ringfence_ring::Opcode::PUT.as_raw() {
            continue;
        }
        let mut got = vec![0u8; sqe.len as usize];
        window.read((i as u64 * SLOT * 4) as usize, &mut got);
        assert!(
            got.iter().all(|&b| b == i as u8 + 1),
            "PUT {i} did not land"
        );
    }
    // Effects respect every fence (weak or strong): an operation after
    // fence k took effect after every operation before it.
    let log = sim.log();
    assert_eq!(log.len(), 79, "70 PUTs and 9 atomics");
    let index_of = |x: &ringfence_testkit::Executed| (x.remote_addr - window.addr()) / (SLOT * 4);
    let epoch = |i: u64| sqes[..i as usize].iter().filter(|s| is_fence(s)).count();
    let epochs: Vec<usize> = log.iter().map(|x| epoch(index_of(x))).collect();
    assert!(
        epochs.windows(2).all(|p| p[0] <= p[1]),
        "an effect crossed a fence: {epochs:?}"
    );
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    assert_eq!(sim.stats().executed_uncommitted, 0);
}

/// A connect the worker gives up on (the endpoint is closed, or the
/// worker dropped) while the handshake runs: the handshake's completion
/// is canceled and ignored, and the queued SQEs complete once, canceled.
#[test]
fn dropping_the_worker_during_a_handshake_cancels_the_queue_once() {
    let (t, window) = target(100 * 4 * SLOT as usize);
    let (w, sim) = initiator(2);
    sim.connect_timing(SimTiming::Delay(Duration::from_secs(3600)));
    let ep = w.connect(t.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(32 * 1024).unwrap();
    let mut qp = w.create_queue().unwrap();
    let sqes = mixed(ep, rkey, window.addr(), &src);
    qp.push_batch(&sqes[..40]).unwrap();
    qp.submit();
    for _ in 0..5 {
        w.progress();
    }
    assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connecting);
    drop(w);
    let mut ids = Vec::new();
    while let Some(c) = qp.pop().unwrap() {
        let want = if is_fence(&sqes[c.user_data as usize]) {
            0
        } else {
            Status::Canceled.as_raw()
        };
        assert_eq!(c.res, want, "{c:?}");
        ids.push(c.user_data);
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..40).collect::<Vec<_>>());
    assert!(sim.log().is_empty());
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

/// What each kind of SQE queued behind a failed handshake completes with,
/// as docs/rust.md's "Connecting" section and `Worker::connect` say: a FENCE
/// completes when it is submitted (R5), while the endpoint is still
/// connecting; the PUTs and FLUSHes queued behind the handshake complete
/// with its error, in submission order; a worker FLUSH covering them fails
/// with it too; a queued graceful CLOSE succeeds (R34) and closes the
/// endpoint, unless the error is `PeerUnreachable`, which it then
/// returns. After the failure, a FENCE succeeds (or fails with
/// `PeerUnreachable` where that is the error) and anything else fails
/// with the error.
#[test]
fn a_failed_handshake_completes_each_kind_of_queued_sqe_as_documented() {
    for error in [Status::Timeout, Status::PeerUnreachable] {
        for close in [false, true] {
            let (t, window) = target(4 * SLOT as usize);
            let (w, sim) = initiator(1);
            sim.connect_polls(5);
            sim.fail_connect(error);
            let ep = w.connect(t.address()).unwrap();
            let rkey = w
                .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
                .unwrap();
            let src = w.alloc_registered(4096).unwrap();
            let e = ep.as_raw();
            let remote = RemoteBuf {
                rkey: rkey.as_raw(),
                addr: window.addr(),
            };
            let mut sqes = vec![
                Sqe::put(e, src.local(0), remote, 8).with_user_data(0),
                Sqe::fence(e, FenceMode::ORDER).with_user_data(1),
                Sqe::put(e, src.local(0), remote, 8).with_user_data(2),
                Sqe::fence(e, FenceMode::COMPLETE).with_user_data(3),
                Sqe::flush(e).with_user_data(4),
                Sqe::flush_worker().with_user_data(5),
            ];
            if close {
                sqes.push(Sqe::close(e, ringfence_ring::CloseMode::GRACEFUL).with_user_data(6));
            }
            let mut qp = w.create_queue().unwrap();
            qp.push_batch(&sqes).unwrap();
            qp.submit();
            // Still connecting: only the FENCEs have completed.
            let mut early = Vec::new();
            for _ in 0..3 {
                w.progress();
                assert_eq!(
                    w.endpoint_state(ep).unwrap(),
                    if close {
                        EndpointState::Closing
                    } else {
                        EndpointState::Connecting
                    }
                );
                while let Some(c) = qp.pop().unwrap() {
                    early.push((c.user_data, c.res));
                }
            }
            assert_eq!(early, [(1, 0), (3, 0)], "{error:?}: FENCEs at submission");
            let rest = run(&w, &mut qp, &[], sqes.len() - 2);
            let rest: Vec<(u64, i32)> = rest.iter().map(|c| (c.user_data, c.res)).collect();
            let status = error.as_raw();
            let mut expected = vec![(0, status), (2, status), (4, status)];
            if close {
                let closed = if error == Status::PeerUnreachable {
                    status
                } else {
                    0
                };
                expected.push((6, closed));
            }
            expected.push((5, status));
            assert_eq!(rest, expected, "{error:?}, close {close}");
            assert_eq!(sim.stats().posted, 0, "nothing posted");
            if close {
                assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Closed);
                continue;
            }
            assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Failed(error));
            let later = run(
                &w,
                &mut qp,
                &[
                    Sqe::fence(e, FenceMode::COMPLETE).with_user_data(7),
                    Sqe::put(e, src.local(0), remote, 8).with_user_data(8),
                ],
                2,
            );
            let fence = if error == Status::PeerUnreachable {
                status
            } else {
                0
            };
            assert_eq!(later[0].res, fence, "{error:?}: a later FENCE");
            assert_eq!(later[1].res, status, "{error:?}: a later PUT");
        }
    }
}
