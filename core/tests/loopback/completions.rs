//! Completions: a full CQ overflows and loses nothing, the core thread
//! completes without inline progress, dropping the worker cancels what is in
//! flight exactly once, and skip-success posts only errors.

use crate::{HANG, Over, Pair, run, with_driver, worker};
use ringfence::Worker;
use ringfence_ring::{Cqe, FenceMode, RemoteBuf, Sqe, SqeFlags, Status};
use std::time::{Duration, Instant};

#[test]
fn a_full_cq_overflows_and_loses_nothing() {
    // The CQ holds 16; 160 operations complete while the application does
    // not reap. The engine keeps the surplus in order, flags the CQ, stops
    // taking SQEs (R47), and hands everything over as the application reaps.
    for over in [Over::NextPoll, Over::Sim] {
        let p = Pair::new(over, 2, 4096);
        let w = with_driver(&mut Worker::builder(), over)
            .ring_entries(256, 16)
            .requests(256)
            .ignore_env()
            .build()
            .unwrap();
        let ep = w.connect(p.target.address()).unwrap();
        let rkey = w
            .unpack_rkey(ep, &p.target.pack_rkey(p.window.handle()).unwrap())
            .unwrap();
        let src = w.alloc_registered(64).unwrap();
        let mut qp = w.create_queue().unwrap();
        let total = 160u64;
        let sqes: Vec<Sqe> = (0..total)
            .map(|i| {
                match i % 3 {
                    0 => Sqe::nop(),
                    1 => Sqe::put(
                        ep.as_raw(),
                        src.local(0),
                        RemoteBuf {
                            rkey: rkey.as_raw(),
                            addr: p.window.addr(),
                        },
                        8,
                    ),
                    _ => Sqe::fence(ep.as_raw(), FenceMode::COMPLETE),
                }
                .with_user_data(i)
            })
            .collect();
        assert_eq!(qp.push_batch(&sqes).unwrap(), sqes.len());
        qp.submit();
        for _ in 0..50 {
            w.progress();
        }
        assert!(qp.is_overflowed(), "the CQ must have overflowed");
        assert!(w.stats().cq_overflows > 0);
        let mut seen = vec![false; total as usize];
        let mut got = 0;
        let deadline = Instant::now() + HANG;
        while got < total {
            // Reap a few at a time, with progress in between.
            let mut batch = [Cqe::default(); 4];
            let n = qp.reap(&mut batch).unwrap();
            for c in &batch[..n] {
                assert!(c.res >= 0, "{c:?}");
                assert!(!seen[c.user_data as usize], "duplicate CQE {}", c.user_data);
                seen[c.user_data as usize] = true;
                got += 1;
            }
            w.progress();
            assert!(Instant::now() < deadline, "lost CQEs: {got} of {total}");
        }
        for _ in 0..10 {
            w.progress();
        }
        assert_eq!(qp.pop().unwrap(), None);
        assert!(!qp.is_overflowed());
    }
}

#[test]
fn core_thread_mode_completes_without_inline_progress() {
    for over in [Over::NextPoll, Over::Sim] {
        let mut w = worker(over, 2);
        w.start_core_thread(None).unwrap();
        assert!(
            w.start_core_thread(None).is_err(),
            "one core thread at a time"
        );
        let target = worker(over, 2);
        let window = target.alloc_registered(1 << 16).unwrap();
        let ep = w.connect(target.address()).unwrap();
        let rkey = w
            .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
            .unwrap();
        let src = w.alloc_registered(1 << 16).unwrap();
        let mut qp = w.create_queue().unwrap();
        let deadline = Instant::now() + HANG;
        for round in 0..200u64 {
            // Let the core thread fall asleep sometimes, so submit must wake it.
            if round % 50 == 0 {
                while w.stats().ops < round * 2 {
                    std::thread::yield_now();
                }
            }
            let remote = RemoteBuf {
                rkey: rkey.as_raw(),
                addr: window.addr() + round * 8,
            };
            src.write(round as usize * 8, &round.to_ne_bytes());
            qp.push(Sqe::put(ep.as_raw(), src.local(round * 8), remote, 8).with_user_data(round))
                .unwrap();
            qp.push(Sqe::flush(ep.as_raw()).with_user_data(1000 + round))
                .unwrap();
            qp.submit();
            let mut got = 0;
            while got < 2 {
                if qp.pop().unwrap().is_some() {
                    got += 1;
                } else if !qp.wait_cqe(Some(Duration::from_secs(1))).unwrap() {
                    assert!(Instant::now() < deadline, "core thread made no progress");
                }
            }
            assert_eq!(
                window.load_u64(round as usize * 8),
                round,
                "flushed data is at the target"
            );
        }
        w.stop_core_thread();
    }
}

#[test]
fn dropping_the_worker_cancels_everything_in_flight_exactly_once() {
    for over in [Over::NextPoll, Over::Sim] {
        let p = Pair::new(over, 2, 4096);
        let src = p.initiator.alloc_registered(4096).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let ep = p.ep.as_raw();
        let mut sqes = Vec::new();
        for i in 0..20u64 {
            sqes.push(Sqe::put(ep, src.local(0), p.remote(0), 64).with_user_data(i));
            if i % 5 == 4 {
                sqes.push(Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(100 + i));
            }
        }
        qp.push_batch(&sqes).unwrap();
        qp.submit();
        p.initiator.progress(); // posts some, queues the rest behind fences
        qp.push(Sqe::nop().with_user_data(999)).unwrap();
        qp.submit(); // still in the SQ at drop time
        drop(p.initiator);
        let mut cqes = Vec::new();
        while let Some(c) = qp.pop().unwrap() {
            cqes.push(c);
        }
        let mut ids: Vec<u64> = cqes.iter().map(|c| c.user_data).collect();
        ids.sort_unstable();
        let mut want: Vec<u64> = sqes.iter().map(|s| s.user_data).chain([999]).collect();
        want.sort_unstable();
        assert_eq!(ids, want, "every SQE completed exactly once");
        assert!(cqes.iter().any(|c| c.res == Status::Canceled.as_raw()));
        // Submitting after the worker is gone completes at once, canceled.
        qp.push(Sqe::nop().with_user_data(5)).unwrap();
        qp.submit();
        assert_eq!(
            qp.pop().unwrap().map(|c| (c.user_data, c.res)),
            Some((5, Status::Canceled.as_raw()))
        );
    }
}

#[test]
fn skip_success_posts_only_errors() {
    for over in [Over::Immediate, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let src = p.initiator.alloc_registered(64).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let ep = p.ep.as_raw();
        let skip = SqeFlags::SKIP_SUCCESS;
        let sqes = [
            Sqe::put(ep, src.local(0), p.remote(0), 8)
                .with_flags(skip)
                .with_user_data(1),
            Sqe::put(ep, src.local(0), p.remote(60), 8)
                .with_flags(skip)
                .with_user_data(2),
            Sqe::nop().with_user_data(3),
        ];
        let cqes = run(&p.initiator, &mut qp, &sqes, 2);
        let got: Vec<(u64, i32)> = cqes.iter().map(|c| (c.user_data, c.res)).collect();
        assert_eq!(got, vec![(2, Status::OutOfBounds.as_raw()), (3, 0)]);
    }
}
