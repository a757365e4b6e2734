//! `QueuePair::wait_cqes`: at least N CQEs or a deadline, progressing
//! inline without a core thread and sleeping on the CQ doorbell with one.
//! No timing assertions: a timeout is only checked to come after its
//! deadline (the clock is monotonic), and waits that must succeed have a
//! deadline that only catches hangs.

use ringfence::{Loopback, QueuePair, Worker};
use ringfence_ring::{RemoteBuf, Sqe, Status};
use std::time::{Duration, Instant};

const HANG: Duration = Duration::from_secs(30);

fn worker() -> Worker {
    Worker::builder()
        .driver(Loopback::new())
        .ring_entries(256, 256)
        .ignore_env()
        .build()
        .unwrap()
}

fn nops(qp: &mut QueuePair, n: u64) {
    for i in 0..n {
        qp.push(Sqe::nop().with_user_data(i)).unwrap();
    }
    qp.submit();
}

fn reap_all(qp: &mut QueuePair) -> usize {
    let mut n = 0;
    while qp.pop().unwrap().is_some() {
        n += 1;
    }
    n
}

#[test]
fn without_a_core_thread_the_wait_progresses_inline() {
    let w = worker();
    let mut qp = w.create_queue().unwrap();
    nops(&mut qp, 100);
    let ready = qp.wait_cqes(100, Some(HANG)).unwrap();
    assert!(ready >= 100, "{ready}");
    assert_eq!(reap_all(&mut qp), 100);
    assert_eq!(qp.wait_cqes(0, Some(Duration::ZERO)), Ok(0));
}

#[test]
fn a_wait_with_nothing_coming_times_out_after_its_deadline() {
    let mut w = worker();
    for core in [false, true] {
        if core {
            w.start_core_thread(None).unwrap();
        }
        let mut qp = w.create_queue().unwrap();
        let timeout = Duration::from_millis(20);
        let start = Instant::now();
        assert_eq!(qp.wait_cqes(1, Some(timeout)), Err(Status::Timeout));
        assert!(start.elapsed() >= timeout, "timed out early (core {core})");
        // What arrives after a timeout is still there.
        nops(&mut qp, 3);
        assert!(qp.wait_cqes(3, Some(HANG)).unwrap() >= 3);
        assert_eq!(reap_all(&mut qp), 3);
    }
}

#[test]
fn with_a_core_thread_the_wait_sleeps_until_enough_cqes_arrived() {
    let mut w = worker();
    w.start_core_thread(None).unwrap();
    let target = worker();
    let window = target.alloc_registered(4096).unwrap();
    let ep = w.connect(target.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(64).unwrap();
    let mut qp = w.create_queue().unwrap();
    for round in 0..300u64 {
        // A few operations at a time, the wait for all of them.
        let n = 1 + round % 5;
        for i in 0..n {
            let remote = RemoteBuf {
                rkey: rkey.as_raw(),
                addr: window.addr() + i * 8,
            };
            qp.push(Sqe::put(ep.as_raw(), src.local(0), remote, 8).with_user_data(i))
                .unwrap();
        }
        qp.push(Sqe::flush(ep.as_raw())).unwrap();
        qp.submit();
        let ready = qp.wait_cqes(n as u32 + 1, Some(HANG)).unwrap();
        assert!(ready > n as u32, "round {round}: {ready}");
        assert_eq!(reap_all(&mut qp), n as usize + 1);
    }
}

#[test]
fn a_wait_for_more_than_the_cq_holds_is_refused() {
    let w = worker();
    let mut qp = w.create_queue().unwrap();
    assert_eq!(qp.wait_cqes(257, None), Err(Status::InvalidArgument));
}
