//! Releasing unpacked remote keys: each driver's part is released exactly
//! once (by the application, at endpoint close, at worker teardown), a
//! released id is stale, release waits for nothing in flight (it refuses
//! while the endpoint has work), and the table does not grow over
//! unpack/release cycles.
//!
//! Deterministic on a loaded machine: nothing sleeps to synchronize, no
//! assertion is about time.

use ringfence::{Loopback, Status, Worker};
use ringfence_ring::{CloseMode, RemoteBuf, Sqe};
use ringfence_testkit::{SimDriver, SimEvent, SimHandle, SimTiming, run_sqes};

/// A worker with two simulated drivers, "sa" and "sb", one endpoint with
/// a lane on each to a target that has both, and the target's window key.
fn mixed() -> (
    Worker,
    Worker,
    [SimHandle; 2],
    ringfence::EndpointId,
    Vec<u8>,
) {
    let (ta, _) = SimDriver::named(Loopback::new().named("sa"), "sa");
    let (tb, _) = SimDriver::named(Loopback::new().named("sb"), "sb");
    let t = Worker::builder()
        .driver(ta)
        .driver(tb)
        .ignore_env()
        .build()
        .unwrap();
    let (a, ha) = SimDriver::named(Loopback::new().named("sa"), "sa");
    let (b, hb) = SimDriver::named(Loopback::new().named("sb"), "sb");
    let w = Worker::builder()
        .driver(a)
        .driver(b)
        .ignore_env()
        .build()
        .unwrap();
    let ep = w
        .connect_lanes(t.address(), &[("sa", 1), ("sb", 1)])
        .unwrap();
    let window = t.alloc_registered(4096).unwrap();
    let key = t.pack_rkey(window.handle()).unwrap();
    // The window stays registered with the target (dropping the buffer
    // handle does not deregister it).
    drop(window);
    (t, w, [ha, hb], ep, key)
}

fn releases(h: &SimHandle) -> usize {
    h.events()
        .iter()
        .filter(|e| matches!(e, SimEvent::ReleaseRkey(..)))
        .count()
}

/// Released by the application: each driver's part once, the id stale
/// (a second release and an SQE naming it are refused), a new unpack
/// gives a new id.
#[test]
fn a_released_key_releases_each_driver_part_once_and_its_id_goes_stale() {
    let (_t, w, h, ep, key) = mixed();
    let rkey = w.unpack_rkey(ep, &key).unwrap();
    assert_eq!(w.unpacked_rkeys(), 1);
    w.release_rkey(rkey).unwrap();
    assert_eq!((releases(&h[0]), releases(&h[1])), (1, 1));
    assert_eq!(w.unpacked_rkeys(), 0);
    let again = w.release_rkey(rkey).map_err(|e| e.status());
    assert_eq!(again, Err(Status::InvalidRkey));
    assert_eq!((releases(&h[0]), releases(&h[1])), (1, 1));
    let src = w.alloc_registered(64).unwrap();
    let mut qp = w.create_queue().unwrap();
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: 0,
    };
    let put = Sqe::put(ep.as_raw(), src.local(0), remote, 8).with_user_data(1);
    let cqes = run_sqes(&w, &mut qp, &[put], 1);
    assert_eq!(cqes[0].res, Status::InvalidRkey.as_raw());
    let next = w.unpack_rkey(ep, &key).unwrap();
    assert_ne!(next, rkey);
}

/// While the endpoint has an operation in flight, release refuses with
/// Busy and changes nothing; after it completed, release succeeds.
#[test]
fn release_refuses_while_the_endpoint_has_work_in_flight() {
    let (t, w, h, ep, key) = mixed();
    h[0].set_timing(SimTiming::Polls(50));
    h[1].set_timing(SimTiming::Polls(50));
    let rkey = w.unpack_rkey(ep, &key).unwrap();
    let window = t.alloc_registered(64).unwrap();
    let wkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(64).unwrap();
    let mut qp = w.create_queue().unwrap();
    let remote = RemoteBuf {
        rkey: wkey.as_raw(),
        addr: window.addr(),
    };
    qp.push(Sqe::put(ep.as_raw(), src.local(0), remote, 8).with_user_data(1))
        .unwrap();
    qp.submit();
    let mut done = Vec::new();
    for _ in 0..10 {
        w.progress();
        while let Some(c) = qp.pop().unwrap() {
            done.push(c);
        }
    }
    assert!(done.is_empty(), "the PUT is still in flight: {done:?}");
    let busy = w.release_rkey(rkey).map_err(|e| e.status());
    assert_eq!(busy, Err(Status::Busy));
    assert_eq!(releases(&h[0]) + releases(&h[1]), 0, "nothing released");
    let cqes = run_sqes(&w, &mut qp, &[], 1);
    assert_eq!(cqes[0].res, 8);
    w.release_rkey(rkey).unwrap();
    assert_eq!((releases(&h[0]), releases(&h[1])), (1, 1));
}

/// Keys still unpacked when their endpoint closes are released then, once
/// each; those of a worker that goes, at its teardown.
#[test]
fn close_and_teardown_release_what_is_still_unpacked() {
    let (_t, w, h, ep, key) = mixed();
    for _ in 0..3 {
        w.unpack_rkey(ep, &key).unwrap();
    }
    let mut qp = w.create_queue().unwrap();
    let close = Sqe::close(ep.as_raw(), CloseMode::GRACEFUL).with_user_data(1);
    let cqes = run_sqes(&w, &mut qp, &[close], 1);
    assert_eq!(cqes[0].res, 0);
    assert_eq!((releases(&h[0]), releases(&h[1])), (3, 3));
    assert_eq!(w.unpacked_rkeys(), 0);
    drop(qp);
    drop(w);
    assert_eq!((releases(&h[0]), releases(&h[1])), (3, 3), "not again");

    let (_t, w, h, ep, key) = mixed();
    w.unpack_rkey(ep, &key).unwrap();
    w.unpack_rkey(ep, &key).unwrap();
    drop(w);
    assert_eq!((releases(&h[0]), releases(&h[1])), (2, 2));
}

/// 10,000 unpack/release cycles: the table holds one key at a time, and
/// every driver part is released.
#[test]
fn unpack_and_release_cycles_do_not_grow_the_table() {
    let (_t, w, h, ep, key) = mixed();
    for _ in 0..10_000 {
        let rkey = w.unpack_rkey(ep, &key).unwrap();
        assert_eq!(w.unpacked_rkeys(), 1);
        w.release_rkey(rkey).unwrap();
    }
    assert_eq!(w.unpacked_rkeys(), 0);
    assert_eq!((releases(&h[0]), releases(&h[1])), (10_000, 10_000));
}
