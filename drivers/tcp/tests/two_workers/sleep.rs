//! Core threads that fall asleep: a sleeping target still acknowledges
//! every PUT, and a sleeping initiator wakes for late answers.

use crate::{Pair, pair, run_with};
use ringfence::{Cqe, RegisteredBuf, Worker};
use ringfence_ring::{RemoteBuf, Sqe};
use std::time::{Duration, Instant};

/// A PUT of `i` from `src` into the window's first 8 bytes (user data 1),
/// then a FLUSH (user data 2).
fn put_then_flush(p: &Pair, src: &RegisteredBuf, i: u64) -> [Sqe; 2] {
    src.store_u64(0, i);
    let remote = RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr(),
    };
    [
        Sqe::put(p.ep.as_raw(), src.local(0), remote, 8).with_user_data(1),
        Sqe::flush(p.ep.as_raw()).with_user_data(2),
    ]
}

/// The completions of a `put_then_flush` in round `round`: both
/// successful, in order.
fn assert_put_then_flush(got: &[Cqe], round: u64) {
    assert_eq!(
        got.iter().map(|c| (c.user_data, c.res)).collect::<Vec<_>>(),
        [(1, 8), (2, 0)],
        "round {round}"
    );
}

/// The target's ACKs wait one round (the round that lands a PUT returns
/// at once): a target whose core thread falls asleep right after that
/// round must still send them. 300 times: the target's core thread asleep,
/// then a PUT and a FLUSH from the initiator, which must both complete
/// (the timeout only catches a hang), with the bytes in place.
#[test]
fn a_sleeping_target_core_thread_still_acknowledges_every_put() {
    let mut p = pair(4096, 1);
    p.target.start_core_thread(None).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let src = p.initiator.alloc_registered(4096).unwrap();
    for i in 0..300u64 {
        // Until the core thread has gone to sleep (bounded, yielding).
        let deadline = Instant::now() + Duration::from_secs(60);
        while !p.target.is_core_thread_asleep() {
            assert!(Instant::now() < deadline, "the core thread never slept");
            p.initiator.progress();
            std::thread::yield_now();
        }
        let sqes = put_then_flush(&p, &src, i);
        let got = run_with(&mut qp, &sqes, 2, deadline, || {
            p.initiator.progress();
        });
        assert_put_then_flush(&got, i);
        assert_eq!(p.window.load_u64(0), i, "round {i}");
    }
    assert!(p.target.core_thread_sleeps() >= 300);
}

/// The initiator's side of the same: a connection that awaits an answer
/// busy-receives (no receive armed) for a while, then goes back to its
/// multishot receive; a core thread that sleeps must be woken by an answer
/// that comes after that. 100 times: the PUT and FLUSH are submitted, the
/// target is left unprogressed until the initiator's core thread has gone
/// to sleep with them in flight, then progressed until both complete.
#[test]
fn a_sleeping_initiator_core_thread_wakes_for_late_answers() {
    let mut p = pair(4096, 1);
    p.initiator.start_core_thread(None).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let src = p.initiator.alloc_registered(4096).unwrap();
    let asleep = |w: &Worker, deadline: Instant, what: &str| {
        while !w.is_core_thread_asleep() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::yield_now();
        }
    };
    for i in 0..100u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        asleep(&p.initiator, deadline, "the core thread never slept");
        let naps = p.initiator.core_thread_sleeps();
        let sqes = put_then_flush(&p, &src, i);
        let mut pushed = 0;
        while pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        // Asleep again, with the PUT unanswered (the target does not run).
        while p.initiator.core_thread_sleeps() == naps || !p.initiator.is_core_thread_asleep() {
            assert!(
                Instant::now() < deadline,
                "round {i}: the core thread never slept again"
            );
            std::thread::yield_now();
        }
        // Both pushed already: the target's progress alone answers them.
        let got = run_with(&mut qp, &[], 2, deadline, || {
            p.target.progress();
        });
        assert_put_then_flush(&got, i);
        assert_eq!(p.window.load_u64(0), i, "round {i}");
    }
}
