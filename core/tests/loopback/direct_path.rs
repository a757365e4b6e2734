//! The direct path: runs of PUTs that stop at a failure, lookups kept from
//! the last PUT, and `try_now`, where it runs at once and where it declines
//! (other drivers, failed endpoints).

use crate::{Over, Pair, pattern, run};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe, SqeFlags, Status};

/// A stream of PUTs to one window runs through the driver in one call
/// (`DirectPath::execute`); a failure in the middle of such a run stops it, and
/// every SQE still gets exactly one CQE, in order, with the status the
/// one-at-a-time path gives.
///
/// Loopback only: runs go through `DirectPath::execute`, which only drivers
/// that finish operations inside the call offer.
#[test]
fn runs_of_puts_stop_at_a_failure_and_lose_nothing() {
    let p = Pair::new(Over::Immediate, 1, 4096);
    let other = p.target.alloc_registered(64).unwrap();
    let other_key = p
        .initiator
        .unpack_rkey(p.ep, &p.target.pack_rkey(other.handle()).unwrap())
        .unwrap();
    let src = p.initiator.alloc_registered(4096).unwrap();
    src.write(0, &pattern(4096, 3));
    let mut qp = p.initiator.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let skip = SqeFlags::SKIP_SUCCESS;
    // Runs broken by an out-of-bounds PUT, a PUT through another key and a
    // GET, with and without SKIP_SUCCESS.
    let mut sqes: Vec<Sqe> = (0..40u64)
        .map(|i| {
            let put = Sqe::put(ep, src.local(i * 64), p.remote(i * 64), 64).with_user_data(i);
            if i % 3 == 0 {
                put
            } else {
                put.with_flags(skip)
            }
        })
        .collect();
    sqes[10] = Sqe::put(ep, src.local(0), p.remote(4090), 64).with_user_data(10);
    sqes[20] = Sqe::put(
        ep,
        src.local(0),
        RemoteBuf {
            rkey: other_key.as_raw(),
            addr: other.addr(),
        },
        64,
    )
    .with_user_data(20);
    sqes[30] = Sqe::get(ep, src.local(30 * 64), p.remote(29 * 64), 64).with_user_data(30);
    let expect: Vec<(u64, i32)> = (0..40u64)
        .filter_map(|i| match i {
            10 => Some((i, Status::OutOfBounds.as_raw())),
            20 | 30 => Some((i, 64)),
            _ if i % 3 == 0 => Some((i, 64)),
            _ => None,
        })
        .collect();
    let cqes = run(&p.initiator, &mut qp, &sqes, expect.len());
    let got: Vec<(u64, i32)> = cqes.iter().map(|c| (c.user_data, c.res)).collect();
    assert_eq!(got, expect);
    let mut landed = vec![0u8; 4096];
    p.window.read(0, &mut landed);
    let want = pattern(4096, 3);
    for i in (0..40).filter(|i| ![10, 20, 30].contains(i)) {
        assert_eq!(landed[i * 64..][..64], want[i * 64..][..64], "PUT {i}");
    }

    // The target withdraws the window: a whole run fails at the target,
    // each PUT with its own CQE.
    p.target.deregister(p.window.handle()).unwrap();
    let sqes: Vec<Sqe> = (0..8u64)
        .map(|i| {
            Sqe::put(ep, src.local(0), p.remote(i * 8), 8)
                .with_flags(skip)
                .with_user_data(100 + i)
        })
        .collect();
    let cqes = run(&p.initiator, &mut qp, &sqes, 8);
    let got: Vec<(u64, i32)> = cqes.iter().map(|c| (c.user_data, c.res)).collect();
    let denied: Vec<(u64, i32)> = (0..8)
        .map(|i| (100 + i, Status::AccessDenied.as_raw()))
        .collect();
    assert_eq!(got, denied);

    // The target goes away: the first PUT of the run fails the endpoint
    // (a transport error), and the rest complete with its sticky error.
    let Pair {
        target, initiator, ..
    } = p;
    drop(target);
    let sqes: Vec<Sqe> = (0..8u64)
        .map(|i| {
            Sqe::put(
                ep,
                src.local(0),
                RemoteBuf {
                    rkey: other_key.as_raw(),
                    addr: other.addr(),
                },
                8,
            )
            .with_flags(skip)
            .with_user_data(200 + i)
        })
        .collect();
    let cqes = run(&initiator, &mut qp, &sqes, 8);
    let got: Vec<(u64, i32)> = cqes.iter().map(|c| (c.user_data, c.res)).collect();
    let gone: Vec<(u64, i32)> = (0..8)
        .map(|i| (200 + i, Status::PeerUnreachable.as_raw()))
        .collect();
    assert_eq!(got, gone);
    let stats = initiator.stats();
    assert_eq!((stats.ops, stats.errors), (56, 17), "{stats:?}");
}

/// The direct path keeps the lookups of the last PUT for the next ones: a
/// registration removed in between must not survive in them.
#[test]
fn a_stale_handle_is_refused_right_after_a_put_through_it() {
    for over in [Over::Immediate, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let mut qp = p.initiator.create_queue().unwrap();
        let ep = p.ep.as_raw();
        let src = p.initiator.alloc_registered(64).unwrap();
        let put = Sqe::put(ep, src.local(0), p.remote(0), 8).with_user_data(1);
        let cqes = run(&p.initiator, &mut qp, &[put, put], 2);
        assert!(cqes.iter().all(|c| c.res == 8), "{cqes:?}");
        p.initiator.deregister(src.handle()).unwrap();
        let cqes = run(&p.initiator, &mut qp, &[put], 1);
        assert_eq!(cqes[0].res, Status::InvalidMemHandle.as_raw());
    }
}

/// `QueuePair::try_now` runs a PUT or GET at once exactly where the ring
/// would start it at once, returns its one completion, and declines
/// (doing nothing) everywhere else: an SQE of this queue pair not yet
/// taken (pushed or submitted; it could be a FENCE), another opcode, an
/// invalid SQE, a driver that keeps operations in flight, a worker that is
/// gone. A declined SQE pushed as usual completes as usual.
///
/// Loopback only: `try_now` runs operations inside the call, which only
/// drivers that finish them there can (the next test shows the others
/// decline).
#[test]
fn try_now_runs_where_the_ring_would_start_at_once_and_declines_elsewhere() {
    let p = Pair::new(Over::Immediate, 1, 4096);
    let mut qp = p.initiator.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let src = p.initiator.alloc_registered(4096).unwrap();
    src.write(0, &pattern(4096, 9));
    let (rkey, base) = (p.rkey.as_raw(), p.window.addr());
    let put = |off: u64, len: u32| {
        let remote = RemoteBuf {
            rkey,
            addr: base + off,
        };
        Sqe::put(ep, src.local(off), remote, len).with_user_data(off)
    };

    // Runs now: the bytes are there on return, counted, and no CQE follows.
    assert_eq!(qp.try_now(&put(0, 64)), Some(Ok(64)));
    assert_eq!(qp.try_now(&put(64, 8)), Some(Ok(8)));
    let get = Sqe::get(ep, src.local(1024), p.remote(0), 72);
    assert_eq!(qp.try_now(&get), Some(Ok(72)));
    let mut landed = vec![0u8; 72];
    p.window.read(0, &mut landed);
    assert_eq!(landed, pattern(4096, 9)[..72]);
    let mut back = vec![0u8; 72];
    src.read(1024, &mut back);
    assert_eq!(back, landed, "the GET read the window");
    let stats = p.initiator.stats();
    assert_eq!((stats.ops, stats.bytes, stats.errors), (3, 144, 0));
    for _ in 0..10 {
        p.initiator.progress();
    }
    assert_eq!(qp.pop().unwrap(), None, "no CQE for what ran now");

    // A pushed SQE not yet submitted, then submitted but not yet taken,
    // goes first: declined, and nothing written.
    let fence = Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(7);
    qp.push(fence).unwrap();
    assert_eq!(qp.try_now(&put(128, 8)), None);
    qp.submit();
    assert_eq!(qp.try_now(&put(128, 8)), None);
    assert_eq!(p.window.load_u64(128), 0, "a declined PUT writes nothing");
    let cqes = run(&p.initiator, &mut qp, &[], 1);
    assert_eq!((cqes[0].user_data, cqes[0].res), (7, 0));
    // The fence's boundary is still ahead (W > C: it is crossed when the
    // next operation arrives, R15): declined, and the ring crosses it.
    assert_eq!(qp.try_now(&put(128, 8)), None);
    let cqes = run(&p.initiator, &mut qp, &[put(128, 8)], 1);
    assert_eq!((cqes[0].user_data, cqes[0].res), (128, 8));
    assert_eq!(qp.try_now(&put(136, 8)), Some(Ok(8)));

    // Not a PUT or GET, or not valid: declined; pushed, it completes as
    // through the ring.
    let nop = Sqe::nop().with_user_data(8);
    let out_of_bounds = Sqe::put(ep, src.local(0), p.remote(4090), 64).with_user_data(9);
    let bad_key = Sqe::put(
        ep,
        src.local(0),
        RemoteBuf {
            rkey: 0,
            addr: p.window.addr(),
        },
        8,
    )
    .with_user_data(10);
    for sqe in [fence, nop, out_of_bounds, bad_key] {
        assert_eq!(qp.try_now(&sqe), None, "{sqe:?}");
    }
    let cqes = run(&p.initiator, &mut qp, &[nop, out_of_bounds, bad_key], 3);
    let got: Vec<(u64, i32)> = cqes.iter().map(|c| (c.user_data, c.res)).collect();
    assert_eq!(
        got,
        [
            (8, 0),
            (9, Status::OutOfBounds.as_raw()),
            (10, Status::InvalidRkey.as_raw())
        ]
    );

    // The target withdraws the window: only the driver can know, so the
    // PUT runs now and fails, and that failure is its completion.
    p.target.deregister(p.window.handle()).unwrap();
    assert_eq!(qp.try_now(&put(0, 8)), Some(Err(Status::AccessDenied)));
    let stats = p.initiator.stats();
    assert_eq!((stats.ops, stats.errors), (10, 3), "{stats:?}");

    // The worker goes away: declined; pushed, it is canceled.
    let Pair { initiator, .. } = p;
    drop(initiator);
    assert_eq!(qp.try_now(&put(0, 8)), None);
    qp.push(put(0, 8)).unwrap();
    qp.submit();
    let cqe = qp.pop().unwrap().expect("canceled at once");
    assert_eq!(cqe.res, Status::Canceled.as_raw());
}

/// A driver that keeps operations in flight (loopback's `NextPoll`, the
/// simulated asynchronous driver) never runs anything now; and a failed endpoint's error is reported
/// by the operation that met it, then by every later try_now (each its operation's one completion)
/// and by CQEs of what is pushed.
#[test]
fn try_now_declines_on_drivers_that_keep_operations_in_flight_and_on_failed_endpoints() {
    for over in [Over::NextPoll, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let mut qp = p.initiator.create_queue().unwrap();
        let src = p.initiator.alloc_registered(64).unwrap();
        let put = Sqe::put(p.ep.as_raw(), src.local(0), p.remote(0), 8).with_user_data(1);
        assert_eq!(qp.try_now(&put), None, "{over:?}");
        assert_eq!(run(&p.initiator, &mut qp, &[put], 1)[0].res, 8);
    }

    let p = Pair::new(Over::Immediate, 1, 64);
    let mut qp = p.initiator.create_queue().unwrap();
    let src = p.initiator.alloc_registered(64).unwrap();
    let put = Sqe::put(p.ep.as_raw(), src.local(0), p.remote(0), 8).with_user_data(2);
    assert_eq!(qp.try_now(&put), Some(Ok(8)));
    let Pair {
        target, initiator, ..
    } = p;
    drop(target);
    assert_eq!(qp.try_now(&put), Some(Err(Status::PeerUnreachable)));
    // The endpoint failed: try_now keeps failing with its sticky error,
    // each call the operation's one completion.
    assert_eq!(
        qp.try_now(&put),
        Some(Err(Status::PeerUnreachable)),
        "the endpoint failed"
    );
    let cqes = run(&initiator, &mut qp, &[put], 1);
    assert_eq!(cqes[0].res, Status::PeerUnreachable.as_raw());
}
