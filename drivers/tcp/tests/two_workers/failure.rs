//! Targets that go away: a dead target fails every request once while the
//! worker serves others, and a target dropped right after a PUT still
//! acknowledges it.

use crate::{Pair, pair, run};
use ringfence::{Cqe, EndpointState};
use ringfence_ring::{RemoteBuf, Sqe};
use std::time::{Duration, Instant};

#[test]
fn a_dead_target_fails_every_request_once_and_the_worker_serves_others() {
    let p = pair(1 << 20, 2);
    let other = pair(4096, 1);
    let src = p.initiator.alloc_registered(1 << 20).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let remote = RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr(),
    };
    // Requests in flight, some answered, when the target goes away.
    let sqes: Vec<Sqe> = (0..200u64)
        .map(|i| {
            let len = if i % 3 == 0 { 64 << 10 } else { 64 };
            Sqe::put(ep, src.local(0), remote, len).with_user_data(i)
        })
        .chain([Sqe::flush(ep).with_user_data(200)])
        .collect();
    qp.push_batch(&sqes).unwrap();
    qp.submit();
    p.initiator.progress();
    p.target.progress();
    let Pair {
        target, initiator, ..
    } = p;
    drop(target);
    let mut cqes = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while cqes.len() < sqes.len() {
        initiator.progress();
        let mut batch = [Cqe::default(); 64];
        let n = qp.reap(&mut batch).unwrap();
        cqes.extend_from_slice(&batch[..n]);
        assert!(
            Instant::now() < deadline,
            "{} of {} completed",
            cqes.len(),
            sqes.len()
        );
        std::thread::yield_now();
    }
    let mut seen = [false; 201];
    for c in &cqes {
        assert!(
            !std::mem::replace(&mut seen[c.user_data as usize], true),
            "twice: {c:?}"
        );
    }
    let flush = cqes.iter().find(|c| c.user_data == 200).unwrap();
    assert!(
        flush.res < 0,
        "a FLUSH over a dead peer succeeded: {flush:?}"
    );
    assert!(
        matches!(
            initiator.endpoint_state(p.ep).unwrap(),
            EndpointState::Failed(_)
        ),
        "{:?}",
        initiator.endpoint_state(p.ep)
    );
    // New requests fail at once.
    let c = run(
        &initiator,
        &other.target,
        &mut qp,
        &[Sqe::put(ep, src.local(0), remote, 8).with_user_data(7)],
        1,
    );
    assert!(c[0].res < 0);
    // The other endpoint (its own initiator and target) goes on; so does
    // a new endpoint of this initiator to a live target.
    let window = other.target.alloc_registered(4096).unwrap();
    let ep2 = initiator
        .connect_lanes(other.target.address(), &[("tcp", 1)])
        .unwrap();
    let rkey2 = initiator
        .unpack_rkey(ep2, &other.target.pack_rkey(window.handle()).unwrap())
        .unwrap();
    src.write(0, b"still here");
    let c = run(
        &initiator,
        &other.target,
        &mut qp,
        &[Sqe::put(
            ep2.as_raw(),
            src.local(0),
            RemoteBuf {
                rkey: rkey2.as_raw(),
                addr: window.addr(),
            },
            10,
        )
        .with_user_data(8)],
        1,
    );
    assert_eq!(c[0].res, 10, "{:?}", c[0]);
    let mut got = [0u8; 10];
    window.read(0, &mut got);
    assert_eq!(&got, b"still here");
}

/// A target dropped right after the round that executed a PUT (its ACK
/// still held for the next round) sends that ACK as it goes: the PUT
/// completes successfully at the initiator, 20 times over.
#[test]
fn a_target_dropped_right_after_a_put_still_acknowledges_it() {
    for round in 0..20u64 {
        let p = pair(4096, 1);
        let mut qp = p.initiator.create_queue().unwrap();
        let src = p.initiator.alloc_registered(64).unwrap();
        src.store_u64(0, round + 1);
        let remote = RemoteBuf {
            rkey: p.rkey.as_raw(),
            addr: p.window.addr(),
        };
        qp.push(Sqe::put(p.ep.as_raw(), src.local(0), remote, 8).with_user_data(1))
            .unwrap();
        qp.submit();
        // Until the target's round has executed it (bounded).
        let deadline = Instant::now() + Duration::from_secs(60);
        while p.window.load_u64(0) != round + 1 {
            p.initiator.progress();
            p.target.progress();
            assert!(Instant::now() < deadline, "the PUT never landed");
            std::thread::yield_now();
        }
        let Pair {
            target, initiator, ..
        } = p;
        drop(target);
        let mut got = None;
        while got.is_none() {
            initiator.progress();
            got = qp.pop().unwrap();
            assert!(Instant::now() < deadline, "no completion for the PUT");
            std::thread::yield_now();
        }
        let c = got.unwrap();
        assert_eq!((c.user_data, c.res), (1, 8), "round {round}: {c:?}");
    }
}
