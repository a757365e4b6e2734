//! Exactly once, under a random mix: every SQE yields one CQE (none for a
//! successful SKIP_SUCCESS), whatever the operation, its validity, the
//! completion mode, the lane count, the interleaving of submission, progress
//! and reaping, and whether the worker is dropped with work in flight;
//! over loopback and over the asynchronous seam (`SimDriver`).

use proptest::prelude::*;
use ringfence::{CompletionMode, EndpointState, Loopback, Worker};
use ringfence_ring::{Cqe, FenceMode, RemoteBuf, Sqe, SqeFlags, Status};
use ringfence_testkit::{SimDriver, SimHandle, SimTiming};
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
enum Step {
    /// Submit one operation to endpoint `ep`.
    Op { ep: usize, kind: Kind, skip: bool },
    /// Run `n` progress rounds.
    Progress(u8),
    /// Reap up to `n` CQEs.
    Reap(u8),
    /// Let the targets post and free notifications.
    Targets,
}

#[derive(Debug, Clone)]
enum Kind {
    Nop,
    Put {
        off: u16,
        len: u16,
    },
    Get {
        off: u16,
        len: u16,
    },
    Fadd {
        word: u8,
    },
    Fence {
        strong: bool,
    },
    Flush,
    /// A worker flush (the step's endpoint is ignored).
    Quiet,
    Notify {
        len: u8,
    },
    /// An SQE with one field broken (which one: the value mod 6).
    Broken(u8),
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Nop),
        (0u16..4096, 1u16..=4096).prop_map(|(off, len)| Kind::Put { off, len }),
        (0u16..4096, 1u16..=4096).prop_map(|(off, len)| Kind::Get { off, len }),
        (0u8..8).prop_map(|word| Kind::Fadd { word }),
        any::<bool>().prop_map(|strong| Kind::Fence { strong }),
        Just(Kind::Flush),
        Just(Kind::Quiet),
        (0u8..=64).prop_map(|len| Kind::Notify { len }),
        any::<u8>().prop_map(Kind::Broken),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0usize..2, kind(), any::<bool>()).prop_map(|(ep, kind, skip)| Step::Op { ep, kind, skip }),
        2 => (1u8..4).prop_map(Step::Progress),
        2 => (1u8..16).prop_map(Step::Reap),
        1 => Just(Step::Targets),
    ]
}

const WINDOW: usize = 8192;

/// The initiator's driver.
#[derive(Debug, Clone, Copy)]
enum Over {
    /// Loopback in this mode (the targets use it too).
    Loopback(CompletionMode),
    /// `SimDriver` over loopback with this timing (for operations and
    /// handshakes) and seed; the handshake of the first endpoint fails
    /// (PEER_UNREACHABLE) if asked. The targets have plain loopback
    /// drivers.
    Sim(SimTiming, u64, bool),
}

fn run_case(
    over: Over,
    lanes: u8,
    steps: &[Step],
    drop_early: bool,
    core_thread: bool,
) -> Result<(), TestCaseError> {
    let mode = match over {
        Over::Loopback(mode) => mode,
        Over::Sim(..) => CompletionMode::Immediate,
    };
    let mut sim: Option<SimHandle> = None;
    let mut build = |initiator: bool| {
        let mut builder = Worker::builder();
        builder
            .lanes(lanes)
            .bw_threshold(1024)
            .notify_buffers(4, 64)
            .ring_entries(32, 16)
            .requests(64)
            .ignore_env();
        match over {
            Over::Sim(timing, seed, fail_connect) if initiator => {
                let (driver, handle) = SimDriver::new(Loopback::new());
                handle.set_timing(timing);
                handle.connect_timing(timing);
                handle.seed(seed);
                if fail_connect {
                    handle.fail_connect(Status::PeerUnreachable);
                }
                sim = Some(handle);
                builder.driver(driver);
            }
            _ => {
                builder.driver(Loopback::with_mode(mode));
            }
        }
        builder.build().unwrap()
    };
    let targets = [build(false), build(false)];
    let mut initiator = build(true);
    if core_thread {
        // Progress then also runs on the core thread, concurrently with the
        // test's own calls.
        initiator.start_core_thread(None).unwrap();
    }
    let mut target_qps: Vec<_> = targets.iter().map(|t| t.create_queue().unwrap()).collect();
    let windows: Vec<_> = targets
        .iter()
        .map(|t| t.alloc_registered(WINDOW).unwrap())
        .collect();
    let local = initiator.alloc_registered(WINDOW).unwrap();
    // Every SQE on the first endpoint may fail with the handshake's error.
    let failed_connect = matches!(over, Over::Sim(_, _, true));
    let mut eps = Vec::new();
    for (i, (t, w)) in targets.iter().zip(&windows).enumerate() {
        let ep = initiator.connect(t.address()).unwrap();
        let rkey = match initiator.unpack_rkey(ep, &t.pack_rkey(w.handle()).unwrap()) {
            Ok(rkey) => rkey.as_raw(),
            Err(e) => {
                // A handshake that failed already (on the core thread)
                // leaves a dead handle, which takes no keys; SQEs on the
                // failed endpoint fail with its error before their key is
                // looked at.
                prop_assert!(failed_connect && i == 0, "{e}");
                prop_assert_eq!(
                    initiator.endpoint_state(ep).unwrap(),
                    EndpointState::Failed(Status::PeerUnreachable)
                );
                0
            }
        };
        eps.push((ep, rkey, w.addr()));
    }
    let mut qp = initiator.create_queue().unwrap();

    // user_data -> (expects a CQE on success, must fail)
    let mut expected: HashMap<u64, (bool, bool)> = HashMap::new();
    // The endpoint each SQE named.
    let mut endpoint_of: HashMap<u64, usize> = HashMap::new();
    let mut seen: HashMap<u64, i32> = HashMap::new();
    let mut next_id = 0u64;
    let reap = |qp: &mut ringfence::QueuePair,
                seen: &mut HashMap<u64, i32>,
                n: usize|
     -> Result<(), TestCaseError> {
        let mut buf = [Cqe::default(); 16];
        let got = qp.reap(&mut buf[..n.min(16)]).unwrap();
        for c in &buf[..got] {
            prop_assert!(
                seen.insert(c.user_data, c.res).is_none(),
                "second CQE for {}",
                c.user_data
            );
        }
        Ok(())
    };
    let serve_targets = |qps: &mut Vec<ringfence::QueuePair>| {
        for (t, q) in targets.iter().zip(qps.iter_mut()) {
            t.progress();
            while let Some(c) = q.pop().unwrap() {
                drop(q.notification(&c));
            }
        }
    };

    for step in steps {
        match step {
            Step::Op { ep, kind, skip } => {
                let (endpoint, rkey, base) = eps[*ep];
                let (e, r) = (endpoint.as_raw(), |off: u64| RemoteBuf {
                    rkey,
                    addr: base + off,
                });
                let (sqe, must_fail) = match kind {
                    Kind::Nop => (Sqe::nop(), false),
                    Kind::Put { off, len } => {
                        let fits = usize::from(*off) + usize::from(*len) <= WINDOW;
                        (
                            Sqe::put(e, local.local(0), r(u64::from(*off)), u32::from(*len)),
                            !fits,
                        )
                    }
                    Kind::Get { off, len } => {
                        let fits = usize::from(*off) + usize::from(*len) <= WINDOW;
                        (
                            Sqe::get(e, local.local(0), r(u64::from(*off)), u32::from(*len)),
                            !fits,
                        )
                    }
                    Kind::Fadd { word } => (
                        Sqe::atomic_fadd(e, local.local(4096), r(u64::from(*word) * 8), 1),
                        false,
                    ),
                    Kind::Fence { strong } => (
                        Sqe::fence(
                            e,
                            if *strong {
                                FenceMode::COMPLETE
                            } else {
                                FenceMode::ORDER
                            },
                        ),
                        false,
                    ),
                    Kind::Flush => (Sqe::flush(e), false),
                    Kind::Quiet => (Sqe::flush_worker(), false),
                    Kind::Notify { len } => {
                        (Sqe::notify(e, local.local(0), u32::from(*len)), false)
                    }
                    Kind::Broken(which) => {
                        let mut s = Sqe::put(e, local.local(0), r(0), 8);
                        match which % 6 {
                            0 => s.opcode = 99,
                            1 => s.flags = 0x40,
                            2 => s.endpoint = 77,
                            3 => s.local_mem = 0,
                            4 => s.rkey = 12345,
                            _ => s.len = 0,
                        }
                        (s, true)
                    }
                };
                let flags = if *skip {
                    SqeFlags::SKIP_SUCCESS
                } else {
                    SqeFlags::EMPTY
                };
                let mut sqe = sqe.with_user_data(next_id);
                sqe.flags |= flags.bits(); // keeps a deliberately broken flag

                // Wait for room in the SQ the way an application would.
                let deadline = Instant::now() + Duration::from_secs(60);
                while qp.push(sqe).is_err() {
                    qp.submit();
                    initiator.progress();
                    reap(&mut qp, &mut seen, 16)?;
                    serve_targets(&mut target_qps);
                    prop_assert!(Instant::now() < deadline, "SQ never drained");
                }
                expected.insert(next_id, (!*skip, must_fail));
                // A worker flush covers endpoint 0 too, and fails with its
                // connect error as its requests do.
                let covers = if matches!(kind, Kind::Quiet) { 0 } else { *ep };
                endpoint_of.insert(next_id, covers);
                next_id += 1;
            }
            Step::Progress(n) => {
                qp.submit();
                for _ in 0..*n {
                    initiator.progress();
                }
            }
            Step::Reap(n) => reap(&mut qp, &mut seen, usize::from(*n))?,
            Step::Targets => serve_targets(&mut target_qps),
        }
    }
    qp.submit();
    if drop_early {
        // Whatever is still in flight completes canceled, exactly once.
        drop(initiator);
        loop {
            let before = seen.len();
            reap(&mut qp, &mut seen, 16)?;
            if seen.len() == before {
                break;
            }
        }
    } else {
        let deadline = Instant::now() + Duration::from_secs(60);
        while expected
            .iter()
            .any(|(id, (cqe_on_success, _))| *cqe_on_success && !seen.contains_key(id))
        {
            initiator.progress();
            reap(&mut qp, &mut seen, 16)?;
            serve_targets(&mut target_qps);
            prop_assert!(Instant::now() < deadline, "completions missing");
        }
        for _ in 0..20 {
            initiator.progress();
            serve_targets(&mut target_qps);
        }
        reap(&mut qp, &mut seen, 16)?;
        prop_assert_eq!(qp.pop().unwrap(), None);
    }
    for (id, res) in &seen {
        let Some(&(cqe_on_success, must_fail)) = expected.get(id) else {
            return Err(TestCaseError::fail(format!(
                "CQE for {id}, never submitted"
            )));
        };
        if res >= &0 {
            prop_assert!(
                cqe_on_success,
                "successful SKIP_SUCCESS {} posted a CQE",
                id
            );
            prop_assert!(!must_fail, "{} should have failed", id);
        } else if !drop_early || *res != Status::Canceled.as_raw() {
            let connect_error = failed_connect
                && endpoint_of.get(id) == Some(&0)
                && *res == Status::PeerUnreachable.as_raw();
            prop_assert!(
                must_fail || connect_error,
                "{} failed: {}",
                id,
                ringfence_ring::strerror(*res)
            );
        }
    }
    if let Some(sim) = &sim {
        prop_assert!(sim.violations().is_empty(), "{:?}", sim.violations());
        prop_assert_eq!(sim.stats().executed_uncommitted, 0);
    }
    if !drop_early {
        for (id, (cqe_on_success, must_fail)) in &expected {
            if *cqe_on_success || *must_fail {
                prop_assert!(seen.contains_key(id), "no CQE for {}", id);
            }
        }
    } else {
        // Every request that must post a CQE did, canceled or not; only
        // successful SKIP_SUCCESS requests may be silent.
        for (id, (cqe_on_success, _)) in &expected {
            if *cqe_on_success {
                prop_assert!(seen.contains_key(id), "no CQE for {} after drop", id);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(debug_assertions) { 300 } else { 2000 }, ..ProptestConfig::default() })]

    #[test]
    fn every_sqe_completes_exactly_once(
        next_poll in any::<bool>(),
        lanes in 1u8..=4,
        steps in prop::collection::vec(step(), 1..300),
        drop_early in any::<bool>(),
        core_thread in prop::bool::weighted(0.2),
    ) {
        let mode = if next_poll { CompletionMode::NextPoll } else { CompletionMode::Immediate };
        run_case(Over::Loopback(mode), lanes, &steps, drop_early, core_thread)?;
    }
}

fn sim_timing() -> impl Strategy<Value = SimTiming> {
    prop_oneof![
        3 => (0u32..4).prop_map(SimTiming::Polls),
        3 => (1u32..3, 0u32..8).prop_map(|(lo, extra)| SimTiming::PollsBetween(lo, lo + extra)),
        1 => (0u64..200).prop_map(|us| SimTiming::Delay(Duration::from_micros(us))),
    ]
}

proptest! {
    // The same cases over the asynchronous seam.
    #![proptest_config(ProptestConfig { cases: if cfg!(debug_assertions) { 200 } else { 1000 }, ..ProptestConfig::default() })]

    #[test]
    fn every_sqe_completes_exactly_once_over_the_async_seam(
        timing in sim_timing(),
        seed in any::<u64>(),
        fail_connect in prop::bool::weighted(0.2),
        lanes in 1u8..=4,
        steps in prop::collection::vec(step(), 1..300),
        drop_early in any::<bool>(),
        core_thread in prop::bool::weighted(0.2),
    ) {
        run_case(Over::Sim(timing, seed, fail_connect), lanes, &steps, drop_early, core_thread)?;
    }
}
