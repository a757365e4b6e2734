//! The engine over the loopback driver: two workers in one process.
//!
//! Each test runs over loopback (completing inside `post`, or on the next
//! poll) and over `SimDriver` (the asynchronous seam: nothing executes
//! before the round's commit, effects land at completion, lanes complete
//! out of order), except where it is about the synchronous path alone
//! (`try_now`, runs of PUTs executed inline), which it says.

use ringfence::{
    CompletionMode, EndpointId, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker, WorkerBuilder,
};
use ringfence_ring::{Cqe, FenceMode, LocalBuf, Opcode, RemoteBuf, Sqe, SqeFlags, Status};
use ringfence_testkit::{SimDriver, SimTiming};
use std::time::{Duration, Instant};

const HANG: Duration = Duration::from_secs(120);

/// The driver a worker is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// Loopback, completing inside `post`.
    Immediate,
    /// Loopback, completing on the next poll.
    NextPoll,
    /// `SimDriver` over loopback: completing 1 to 3 polls after the
    /// round's commit, each operation on its own.
    Sim,
}

/// Every driver.
const ALL: [Over; 3] = [Over::Immediate, Over::NextPoll, Over::Sim];

/// Adds `over`'s driver to `builder`.
fn with_driver(builder: &mut WorkerBuilder, over: Over) -> &mut WorkerBuilder {
    match over {
        Over::Immediate => builder.driver(Loopback::new()),
        Over::NextPoll => builder.driver(Loopback::with_mode(CompletionMode::NextPoll)),
        Over::Sim => {
            let (sim, handle) = SimDriver::new(Loopback::new());
            handle.set_timing(SimTiming::PollsBetween(1, 3));
            builder.driver(sim)
        }
    }
}

fn worker(over: Over, lanes: u8) -> Worker {
    with_driver(&mut Worker::builder(), over)
        .lanes(lanes)
        .bw_threshold(4096)
        .notify_buffers(8, 256)
        .ignore_env()
        .build()
        .unwrap()
}

/// An initiator connected to a target that exposes a window.
struct Pair {
    target: Worker,
    initiator: Worker,
    window: RegisteredBuf,
    ep: EndpointId,
    rkey: RkeyId,
}

impl Pair {
    fn new(over: Over, lanes: u8, window: usize) -> Pair {
        let target = worker(over, lanes);
        let initiator = worker(over, lanes);
        let window = target.alloc_registered(window).unwrap();
        let ep = initiator.connect(target.address()).unwrap();
        let rkey = initiator
            .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
            .unwrap();
        // The key tells the address PUTs name and the window's length.
        assert_eq!(
            initiator.rkey_bounds(ep, rkey).unwrap(),
            (window.addr(), window.len() as u64)
        );
        let bogus = ringfence::RkeyId::from_raw(rkey.as_raw() + 1000);
        assert_eq!(
            initiator.rkey_bounds(ep, bogus).unwrap_err().status(),
            ringfence_ring::Status::InvalidRkey
        );
        Pair {
            target,
            initiator,
            window,
            ep,
            rkey,
        }
    }

    fn remote(&self, offset: u64) -> RemoteBuf {
        RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.window.addr() + offset,
        }
    }
}

/// Submits `sqes` and runs progress until `expect` CQEs arrived; returns them.
fn run(worker: &Worker, qp: &mut QueuePair, sqes: &[Sqe], expect: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + HANG;
    let mut pushed = 0;
    let mut out = Vec::new();
    while out.len() < expect {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        worker.progress();
        let mut batch = [Cqe::default(); 64];
        let n = qp.reap(&mut batch).unwrap();
        out.extend_from_slice(&batch[..n]);
        assert!(
            Instant::now() < deadline,
            "hung with {} of {expect} CQEs",
            out.len()
        );
    }
    // Nothing more may come: exactly once.
    for _ in 0..10 {
        worker.progress();
    }
    assert_eq!(qp.pop().unwrap(), None, "a CQE beyond the expected count");
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn put_and_get_move_the_right_bytes_at_every_size() {
    for mode in ALL {
        let max = 4 << 20;
        let p = Pair::new(mode, 4, max + 64);
        let src = p.initiator.alloc_registered(max).unwrap();
        let back = p.initiator.alloc_registered(max).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let mut len = 1;
        while len <= max {
            let data = pattern(len, len as u8);
            src.write(0, &data);
            let ep = p.ep.as_raw();
            let sqes = [
                Sqe::put(ep, src.local(0), p.remote(7), len as u32).with_user_data(1),
                Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(2),
                Sqe::get(ep, back.local(0), p.remote(7), len as u32).with_user_data(3),
            ];
            let cqes = run(&p.initiator, &mut qp, &sqes, 3);
            let mut by_id: Vec<(u64, i32)> = cqes.iter().map(|c| (c.user_data, c.res)).collect();
            by_id.sort();
            assert_eq!(
                by_id,
                vec![(1, len as i32), (2, 0), (3, len as i32)],
                "{mode:?} len {len}"
            );
            let mut landed = vec![0u8; len];
            p.window.read(7, &mut landed);
            assert_eq!(landed, data, "{mode:?}: target bytes at len {len}");
            let mut got = vec![0u8; len];
            back.read(0, &mut got);
            assert_eq!(
                got, data,
                "{mode:?}: GET after the fence read the PUT's bytes at len {len}"
            );
            len = if len < 64 { len + 1 } else { len * 4 };
        }
        let stats = p.initiator.endpoint_stats(p.ep).unwrap();
        assert!(stats.bytes > 0 && stats.fences > 0 && stats.errors == 0);
    }
}

#[test]
fn atomics_fetch_and_apply() {
    for mode in ALL {
        let p = Pair::new(mode, 2, 64);
        let result = p.initiator.alloc_registered(64).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let ep = p.ep.as_raw();
        p.window.write(8, &10u64.to_ne_bytes());
        let strong = |ud| Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(ud);
        let sqes = [
            Sqe::atomic_add(ep, p.remote(8), 5).with_user_data(1),
            strong(100),
            Sqe::atomic_fadd(ep, result.local(0), p.remote(8), 2).with_user_data(2),
            strong(101),
            Sqe::atomic_swap(ep, result.local(8), p.remote(8), 40).with_user_data(3),
            strong(102),
            Sqe::atomic_cswap(ep, result.local(16), p.remote(8), 41, 99).with_user_data(4),
            strong(103),
            Sqe::atomic_cswap(ep, result.local(24), p.remote(8), 40, 77).with_user_data(5),
        ];
        let cqes = run(&p.initiator, &mut qp, &sqes, sqes.len());
        assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
        assert_eq!(result.load_u64(0), 15, "FADD fetched the value after ADD");
        assert_eq!(result.load_u64(8), 17, "SWAP fetched the value after FADD");
        assert_eq!(
            result.load_u64(16),
            40,
            "failed CSWAP fetches the current value"
        );
        assert_eq!(
            result.load_u64(24),
            40,
            "successful CSWAP fetches the old value"
        );
        assert_eq!(p.window.load_u64(8), 77);
    }
}

#[test]
fn two_initiators_contend_on_one_word() {
    for over in [Over::Immediate, Over::Sim] {
        const N: u64 = 2000;
        let target = worker(over, 1);
        let window = target.alloc_registered(8).unwrap();
        let key = target.pack_rkey(window.handle()).unwrap();
        let address = target.address().to_vec();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (address, key) = (address.clone(), key.clone());
                let window_addr = window.addr();
                std::thread::spawn(move || {
                    let w = worker(over, 1);
                    let ep = w.connect(&address).unwrap();
                    let rkey = w.unpack_rkey(ep, &key).unwrap();
                    let results = w.alloc_registered(8 * N as usize).unwrap();
                    let mut qp = w.create_queue().unwrap();
                    let remote = RemoteBuf {
                        rkey: rkey.as_raw(),
                        addr: window_addr,
                    };
                    let sqes: Vec<Sqe> = (0..N)
                        .map(|i| {
                            Sqe::atomic_fadd(ep.as_raw(), results.local(8 * i), remote, 1)
                                .with_user_data(i)
                        })
                        .collect();
                    let cqes = run(&w, &mut qp, &sqes, N as usize);
                    assert!(cqes.iter().all(|c| c.res == 8));
                    (0..N)
                        .map(|i| results.load_u64(8 * i as usize))
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut fetched: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        fetched.sort_unstable();
        assert_eq!(
            fetched,
            (0..2 * N).collect::<Vec<u64>>(),
            "every old value seen exactly once"
        );
        assert_eq!(window.load_u64(0), 2 * N);
    }
}

#[test]
fn notifications_arrive_after_earlier_data_with_their_payload() {
    for mode in ALL {
        let p = Pair::new(mode, 4, 1 << 16);
        let src = p.initiator.alloc_registered(1 << 16).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let mut target_qp = p.target.create_queue().unwrap();
        let ep = p.ep.as_raw();
        for round in 0..20u64 {
            let data = pattern(8192, round as u8);
            src.write(0, &data);
            src.write(10_000, format!("round {round}").as_bytes());
            let sqes = [
                // Large: a bandwidth lane; the notify goes on lane 0.
                Sqe::put(ep, src.local(0), p.remote(0), 8192).with_user_data(1),
                Sqe::notify(ep, src.local(10_000), format!("round {round}").len() as u32)
                    .with_user_data(2),
            ];
            let mut sqes = sqes;
            sqes[1].operand = 0xabc0 + round;
            let cqes = run(&p.initiator, &mut qp, &sqes, 2);
            assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
            // The target sees the notification, and by then the data.
            let deadline = Instant::now() + HANG;
            let note = loop {
                p.target.progress();
                if let Some(c) = target_qp.pop().unwrap() {
                    break c;
                }
                assert!(Instant::now() < deadline);
            };
            assert_eq!(note.user_data, 0xabc0 + round, "the tag");
            let payload = target_qp.notification(&note).expect("a notification CQE");
            assert_eq!(&*payload, format!("round {round}").as_bytes());
            drop(payload);
            assert!(target_qp.notification(&note).is_none(), "read once");
            let mut landed = vec![0u8; 8192];
            p.window.read(0, &mut landed);
            assert_eq!(landed, data, "data before notification");
        }
        assert_eq!(p.target.stats().notifications, 20);
    }
}

#[test]
fn every_invalid_sqe_gets_its_own_status_and_writes_nothing() {
    for over in [Over::Immediate, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let src = p.initiator.alloc_registered(64).unwrap();
        src.write(0, &[0xee; 64]);
        let mut qp = p.initiator.create_queue().unwrap();
        let ep = p.ep.as_raw();
        let put = Sqe::put(ep, src.local(0), p.remote(0), 8);
        let mut bad_opcode = put;
        bad_opcode.opcode = 42;
        let mut bad_flags = put;
        bad_flags.flags = 0x80;
        let mut reserved = put;
        reserved.reserved1 = 1;
        let mut bad_subop = Sqe::fence(ep, FenceMode::COMPLETE);
        bad_subop.subop = 7;
        let mut put_subop = put;
        put_subop.subop = 1;
        let cases: Vec<(Sqe, Status)> = vec![
            (bad_opcode, Status::InvalidOpcode),
            (bad_flags, Status::InvalidFlags),
            (reserved, Status::InvalidArgument),
            (bad_subop, Status::InvalidSubop),
            (put_subop, Status::InvalidSubop),
            (
                Sqe {
                    endpoint: 999,
                    ..put
                },
                Status::InvalidEndpoint,
            ),
            (
                Sqe {
                    local_mem: 0,
                    ..put
                },
                Status::InvalidMemHandle,
            ),
            (
                Sqe {
                    local_mem: src.handle().as_raw() ^ 0x1_0000,
                    ..put
                },
                Status::InvalidMemHandle,
            ),
            (Sqe { rkey: 0, ..put }, Status::InvalidRkey),
            (Sqe { rkey: 777, ..put }, Status::InvalidRkey),
            (Sqe { len: 0, ..put }, Status::InvalidLength),
            (Sqe { len: 65, ..put }, Status::OutOfBounds),
            (
                Sqe {
                    local_addr: src.addr() + 60,
                    ..put
                },
                Status::OutOfBounds,
            ),
            (
                Sqe {
                    remote_addr: p.window.addr() + 57,
                    ..put
                },
                Status::OutOfBounds,
            ),
            (
                Sqe {
                    remote_addr: u64::MAX - 3,
                    ..put
                },
                Status::OutOfBounds,
            ),
            (Sqe::atomic_add(ep, p.remote(4), 1), Status::Misaligned),
            (
                Sqe::atomic_fadd(ep, src.local(4), p.remote(8), 1),
                Status::Misaligned,
            ),
            (
                Sqe {
                    len: 4,
                    ..Sqe::atomic_add(ep, p.remote(8), 1)
                },
                Status::InvalidLength,
            ),
            (
                Sqe {
                    subop: 3,
                    ..Sqe::atomic_add(ep, p.remote(8), 1)
                },
                Status::InvalidMemHandle,
            ),
            (
                Sqe::notify(ep, src.local(0), 1 << 20),
                Status::InvalidLength,
            ),
        ];
        let sqes: Vec<Sqe> = cases
            .iter()
            .enumerate()
            .map(|(i, (s, _))| s.with_user_data(i as u64))
            .collect();
        let mut cqes = run(&p.initiator, &mut qp, &sqes, sqes.len());
        cqes.sort_by_key(|c| c.user_data);
        for (c, (_, want)) in cqes.iter().zip(&cases) {
            assert_eq!(
                c.res,
                want.as_raw(),
                "case {}: {}",
                c.user_data,
                ringfence_ring::strerror(c.res)
            );
        }
        let mut window = [0u8; 64];
        p.window.read(0, &mut window);
        assert_eq!(window, [0u8; 64], "no invalid SQE wrote anything");
        assert_eq!(p.initiator.stats().errors, cases.len() as u64);
    }
}

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

#[test]
fn a_strong_fence_orders_puts_across_lanes() {
    for over in [Over::NextPoll, Over::Sim] {
        // Four lanes, completion on poll with rotating lane order: without the
        // fence, the second PUT (another lane) could land first.
        let p = Pair::new(over, 4, 1 << 16);
        let src = p.initiator.alloc_registered(1 << 16).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let ep = p.ep.as_raw();
        for round in 0..50u64 {
            src.write(0, &vec![round as u8; 8192]);
            src.write(8192, &vec![round as u8 + 1; 8192]);
            let sqes = [
                Sqe::put(ep, src.local(0), p.remote(0), 8192).with_user_data(1),
                Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(2),
                Sqe::put(ep, src.local(8192), p.remote(0), 8192).with_user_data(3),
            ];
            run(&p.initiator, &mut qp, &sqes, 3);
            let mut landed = vec![0u8; 8192];
            p.window.read(0, &mut landed);
            assert!(
                landed.iter().all(|&b| b == round as u8 + 1),
                "round {round}: the later PUT must win"
            );
        }
        let stats = p.initiator.endpoint_stats(p.ep).unwrap();
        assert!(stats.flushes >= 50 && stats.deferrals >= 50, "{stats:?}");
    }
}

#[test]
fn deregistration_is_refused_while_in_use_and_keys_die_with_it() {
    for over in [Over::Immediate, Over::Sim] {
        // The target has 8 notification buffers and reads none: the ninth
        // NOTIFY cannot be delivered and keeps its payload buffer in use.
        let p = Pair::new(over, 1, 64);
        let src = p.initiator.alloc_registered(64).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let mut target_qp = p.target.create_queue().unwrap();
        let ep = p.ep.as_raw();
        let notes: Vec<Sqe> = (0..9)
            .map(|i| Sqe::notify(ep, src.local(0), 4).with_user_data(i))
            .collect();
        let done = run(&p.initiator, &mut qp, &notes[..8], 8);
        assert!(done.iter().all(|c| c.res == 4));
        qp.push(notes[8]).unwrap();
        qp.submit();
        for _ in 0..10 {
            p.initiator.progress();
        }
        assert_eq!(qp.pop().unwrap(), None, "the ninth waits for a buffer");
        let err = p.initiator.deregister(src.handle()).unwrap_err();
        assert_eq!(err.status(), Status::Busy);
        // The target reads one notification: the buffer frees, the ninth lands.
        let note = loop {
            p.target.progress();
            if let Some(c) = target_qp.pop().unwrap() {
                break c;
            }
        };
        drop(target_qp.notification(&note).unwrap());
        let cqes = run(&p.initiator, &mut qp, &[], 1);
        assert_eq!((cqes[0].user_data, cqes[0].res), (8, 4));
        p.initiator.deregister(src.handle()).unwrap();
        assert_eq!(
            p.initiator.deregister(src.handle()).unwrap_err().status(),
            Status::InvalidMemHandle
        );
        // The target withdraws its window: the old key is refused at the target.
        let src2 = p.initiator.alloc_registered(64).unwrap();
        p.target.deregister(p.window.handle()).unwrap();
        let cqes = run(
            &p.initiator,
            &mut qp,
            &[Sqe::put(ep, src2.local(0), p.remote(0), 8).with_user_data(2)],
            1,
        );
        assert_eq!(cqes[0].res, Status::AccessDenied.as_raw());
    }
}

#[test]
fn forged_and_foreign_keys_are_refused() {
    for over in [Over::Immediate, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let key = p.target.pack_rkey(p.window.handle()).unwrap();
        for cut in [0, 3, 10, key.len() - 1] {
            assert!(
                p.initiator.unpack_rkey(p.ep, &key[..cut]).is_err(),
                "truncated at {cut}"
            );
        }
        // A key for a third worker's memory cannot be used on this endpoint.
        let other = worker(over, 1);
        let other_buf = other.alloc_registered(64).unwrap();
        let foreign = other.pack_rkey(other_buf.handle()).unwrap();
        assert!(p.initiator.unpack_rkey(p.ep, &foreign).is_err());
        // A forged secret: flip a byte of the driver part (its last 8
        // bytes, before the key's 4-byte integrity check). Refused at
        // unpack as damage; forged with a correct check (anyone can compute
        // it), the target refuses every access.
        let mut forged = key.clone();
        let at = forged.len() - 5;
        forged[at] ^= 0x55;
        let e = p.initiator.unpack_rkey(p.ep, &forged).unwrap_err();
        assert!(matches!(e, ringfence::Error::Malformed { .. }), "{e}");
        ringfence::reseal(&mut forged);
        let bad = p.initiator.unpack_rkey(p.ep, &forged).unwrap();
        let src = p.initiator.alloc_registered(8).unwrap();
        src.write(0, &[1; 8]);
        let mut qp = p.initiator.create_queue().unwrap();
        let remote = RemoteBuf {
            rkey: bad.as_raw(),
            addr: p.window.addr(),
        };
        let cqes = run(
            &p.initiator,
            &mut qp,
            &[Sqe::put(p.ep.as_raw(), src.local(0), remote, 8)],
            1,
        );
        assert_eq!(cqes[0].res, Status::AccessDenied.as_raw());
        assert_eq!(p.window.load_u64(0), 0, "nothing written");
        let _ = LocalBuf::default();
        let _ = Opcode::NOP;
    }
}

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

/// `store_u64` writes one word that a GET from the peer reads back; an
/// unaligned or out-of-bounds offset panics and writes nothing.
#[test]
fn store_u64_is_one_word_a_peer_reads() {
    for over in [Over::Immediate, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let mut qp = p.initiator.create_queue().unwrap();
        let local = p.initiator.alloc_registered(64).unwrap();
        p.window.store_u64(8, 0x0102_0304_0506_0708);
        assert_eq!(p.window.load_u64(8), 0x0102_0304_0506_0708);
        let get = Sqe::get(p.ep.as_raw(), local.local(0), p.remote(8), 8).with_user_data(1);
        let c = run(&p.initiator, &mut qp, &[get], 1);
        assert_eq!(c[0].res, 8);
        let mut got = [0u8; 8];
        local.read(0, &mut got);
        assert_eq!(u64::from_ne_bytes(got), 0x0102_0304_0506_0708);
        for offset in [4, 60, 64, usize::MAX - 3] {
            let window = std::panic::AssertUnwindSafe(&p.window);
            let refused = std::panic::catch_unwind(|| window.store_u64(offset, u64::MAX));
            assert!(refused.is_err(), "offset {offset} refused");
        }
        let mut all = [0u8; 64];
        p.window.read(0, &mut all);
        assert!(
            all.iter()
                .enumerate()
                .all(|(i, &b)| (8..16).contains(&i) || b == 0),
            "nothing else written: {all:?}"
        );
    }
}

/// A FLUSH succeeds only if the peer is alive when it completes, even
/// with nothing to flush (`Driver::check_alive`); so does a graceful
/// CLOSE, which closes the endpoint all the same; a FENCE on the failed
/// endpoint fails too. Over a peer that lives,
/// both succeed.
#[test]
fn a_flush_with_nothing_to_flush_fails_once_the_peer_is_gone() {
    for over in [Over::Immediate, Over::NextPoll, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let mut qp = p.initiator.create_queue().unwrap();
        let e = p.ep.as_raw();
        let flush = Sqe::flush(e).with_user_data(1);
        assert_eq!(
            run(&p.initiator, &mut qp, &[flush], 1)[0].res,
            0,
            "{over:?}"
        );
        let Pair {
            target,
            initiator,
            ep,
            ..
        } = p;
        drop(target);
        let c = run(&initiator, &mut qp, &[flush], 1);
        assert_eq!(c[0].res, Status::PeerUnreachable.as_raw(), "{over:?}");
        // The endpoint failed with it: a FENCE there fails the same way.
        let fence = Sqe::fence(e, ringfence_ring::FenceMode::ORDER).with_user_data(3);
        let c = run(&initiator, &mut qp, &[fence], 1);
        assert_eq!(c[0].res, Status::PeerUnreachable.as_raw(), "{over:?}");
        let close = Sqe::close(e, ringfence_ring::CloseMode::GRACEFUL).with_user_data(2);
        let c = run(&initiator, &mut qp, &[close], 1);
        assert_eq!(c[0].res, Status::PeerUnreachable.as_raw(), "{over:?}");
        assert!(
            matches!(
                initiator.endpoint_state(ep),
                Ok(ringfence::EndpointState::Closed)
            ),
            "{over:?}"
        );
    }
}
