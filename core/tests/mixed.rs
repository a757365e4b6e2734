//! Memory kinds and endpoints with lanes on several drivers (one fence
//! domain over all of them, docs/fence.md R24, R28), over two loopback drivers
//! under different names, each wrapped in a `FaultInjector` so that its
//! timing and its flushes can be set and seen.

use ringfence::{
    CompletionMode, Error, Loopback, MemKind, MemKinds, OpKind, QueuePair, RegisteredBuf, RkeyId,
    Worker,
};
use ringfence_ring::{Cqe, FenceMode, RemoteBuf, Sqe, Status};
use ringfence_testkit::{FaultHandle, FaultInjector, LoopbackTarget, Timing, run_sqes as run};

/// PUTs from this size take bandwidth lanes.
const BIG: u32 = 1024;

/// An initiator with drivers "lb-a" (2 lanes, synchronous) and "lb-b" (4
/// lanes, completing at the next poll; it also registers memory it is told
/// is CUDA memory), connected to a target that has both, with one endpoint
/// over both drivers.
struct Mixed {
    _target: Worker,
    initiator: Worker,
    a: FaultHandle,
    b: FaultHandle,
    window: RegisteredBuf,
    ep: u32,
    rkey: RkeyId,
    src: RegisteredBuf,
    qp: QueuePair,
}

const KINDS: MemKinds = MemKinds::HOST.union(MemKinds::CUDA);

fn mixed() -> Mixed {
    let (a_driver, a) = FaultInjector::new(Loopback::new().named("lb-a"));
    let (b_driver, b) = FaultInjector::new(
        Loopback::with_mode(CompletionMode::Immediate)
            .named("lb-b")
            .with_mem_kinds(KINDS),
    );
    a.set_timing(Timing::Synchronous);
    b.set_timing(Timing::NextPoll);
    let initiator = Worker::builder()
        .driver(a_driver)
        .driver(b_driver)
        .bw_threshold(BIG)
        .ignore_env()
        .build()
        .unwrap();
    let LoopbackTarget {
        worker: target,
        window,
        ep,
        rkey,
    } = LoopbackTarget::connect_mixed(&initiator, &[("lb-a", 2), ("lb-b", 4)], 1 << 16);
    let src = initiator.alloc_registered(1 << 16).unwrap();
    let qp = initiator.create_queue().unwrap();
    Mixed {
        _target: target,
        initiator,
        a,
        b,
        window,
        ep: ep.as_raw(),
        rkey,
        src,
        qp,
    }
}

impl Mixed {
    fn remote(&self, offset: u64) -> RemoteBuf {
        RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.window.addr() + offset,
        }
    }

    fn put(&self, src_offset: u64, dst_offset: u64, len: u32, user_data: u64) -> Sqe {
        Sqe::put(
            self.ep,
            self.src.local(src_offset),
            self.remote(dst_offset),
            len,
        )
        .with_user_data(user_data)
    }

    fn run(&mut self, sqes: &[Sqe]) -> Vec<Cqe> {
        let cqes = run(&self.initiator, &mut self.qp, sqes, sqes.len());
        for cqe in &cqes {
            assert!(
                cqe.res >= 0,
                "user_data {} failed: {}",
                cqe.user_data,
                cqe.res
            );
        }
        cqes
    }
}

#[test]
fn device_memory_with_only_host_drivers_is_a_clear_error() {
    let w = Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .unwrap();
    match w.alloc_registered_kind(4096, MemKind::Cuda(0)) {
        Err(Error::Unsupported(why)) => assert!(why.contains("Cuda"), "{why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let mut host = vec![0u8; 4096];
    // SAFETY: `host` outlives the worker's use of it (the call fails).
    let registered = unsafe { w.register(host.as_mut_ptr(), host.len(), MemKind::Cuda(0)) };
    let err = registered.unwrap_err();
    assert_eq!(err.status(), Status::Unsupported);
    assert!(err.to_string().contains("loopback"), "{err}");
    // Host memory still registers.
    assert_eq!(
        w.alloc_registered_kind(64, MemKind::Host).unwrap().kind(),
        MemKind::Host
    );
}

#[test]
fn two_drivers_of_one_name_are_refused_at_build() {
    let built = Worker::builder()
        .driver(Loopback::new())
        .driver(Loopback::new())
        .ignore_env()
        .build();
    assert!(matches!(built, Err(Error::Drivers(_))), "{built:?}");
}

#[test]
fn connect_lanes_checks_its_groups() {
    let target = Worker::builder()
        .driver(Loopback::new().named("lb-a"))
        .ignore_env()
        .build()
        .unwrap();
    let w = Worker::builder()
        .driver(Loopback::new().named("lb-a"))
        .driver(Loopback::new().named("lb-b"))
        .ignore_env()
        .build()
        .unwrap();
    let status = |r: Result<_, Error>| r.unwrap_err().status();
    let addr = target.address();
    assert_eq!(status(w.connect_lanes(addr, &[])), Status::InvalidArgument);
    assert_eq!(
        status(w.connect_lanes(addr, &[("lb-a", 0)])),
        Status::InvalidArgument
    );
    assert_eq!(
        status(w.connect_lanes(addr, &[("lb-a", 1), ("lb-a", 1)])),
        Status::InvalidArgument
    );
    assert_eq!(
        status(w.connect_lanes(addr, &[("lb-a", 40), ("lb-b", 40)])),
        Status::InvalidArgument,
        "more than 64 lanes"
    );
    // The target has no "lb-b"; this worker has no "shm".
    assert_eq!(
        status(w.connect_lanes(addr, &[("lb-a", 1), ("lb-b", 1)])),
        Status::PeerUnreachable
    );
    assert_eq!(
        status(w.connect_lanes(addr, &[("shm", 1)])),
        Status::PeerUnreachable
    );
    // One group: an ordinary endpoint over that driver.
    w.connect_lanes(addr, &[("lb-a", 3)]).unwrap();
}

/// The same address written on lane 3 (lb-b, completing late) and then on
/// lane 0 (lb-a, completing at once): without a fence the later write can
/// land first, and the earlier one ends up in memory; with a strong fence
/// between them the later value wins, and the fence's flush covers exactly
/// the dirty lanes of each driver.
#[test]
fn r28_a_strong_fence_orders_effects_across_drivers() {
    let mut m = mixed();
    m.src.write(0, &[0xbb; BIG as usize]);
    m.src.write(BIG as usize, &[0xaa; 8]);

    // No fence: the large PUT (lb-b) lands after the small one (lb-a).
    m.run(&[m.put(0, 0, BIG, 1), m.put(u64::from(BIG), 0, 8, 2)]);
    let mut got = [0u8; 8];
    m.window.read(0, &mut got);
    assert_eq!(
        got, [0xbb; 8],
        "the reordering this test guards against did not happen"
    );

    // Strong fence: the small PUT waits for the flush of lb-b's lane.
    let flushes_a = m.a.flushes().len();
    let flushes_b = m.b.flushes().len();
    m.run(&[
        m.put(0, 4096, BIG, 3),
        Sqe::fence(m.ep, FenceMode::COMPLETE).with_user_data(4),
        m.put(u64::from(BIG), 4096, 8, 5),
    ]);
    m.window.read(4096, &mut got);
    assert_eq!(got, [0xaa; 8], "the write after the fence must win");
    let new_a = &m.a.flushes()[flushes_a..];
    let new_b = &m.b.flushes()[flushes_b..];
    // Dirty before the fence, never flushed since: lane 0 (lb-a's lane 0,
    // the small PUT of the first round), lanes 3 and 4 (lb-b's lanes 1 and
    // 2: the two large PUTs took its bandwidth lanes in turn); lb-b's lanes
    // 0 and 3 were never written. Each driver flushes exactly its own
    // (R24), in its own lane numbers.
    assert_eq!(new_a.iter().map(|f| f.1).collect::<Vec<_>>(), vec![0b1]);
    assert_eq!(new_b.iter().map(|f| f.1).collect::<Vec<_>>(), vec![0b110]);
}

#[test]
fn operations_take_a_driver_that_can_reach_their_memory() {
    let mut m = mixed();
    // Memory this worker is told is device memory: only lb-b registers it.
    let mut device = vec![0x5au8; 256];
    // SAFETY: `device` lives to the end of the test, past every operation
    // on it; the worker is dropped (and quiesced) before it.
    let handle = unsafe {
        m.initiator
            .register(device.as_mut_ptr(), device.len(), MemKind::Cuda(0))
            .unwrap()
    };
    let from_device = |len: u32, dst: u64, ud: u64| {
        Sqe::put(
            m.ep,
            ringfence_ring::LocalBuf {
                mem: handle.as_raw(),
                addr: device.as_ptr() as u64,
            },
            m.remote(dst),
            len,
        )
        .with_user_data(ud)
    };
    let small = from_device(8, 8192, 1);
    let before = m.b.log().len();
    m.run(&[small]);
    let log = m.b.log();
    let executed = &log[before..];
    assert_eq!(
        executed.len(),
        1,
        "the small PUT from device memory went to lb-b"
    );
    assert_eq!((executed[0].kind, executed[0].lane), (OpKind::Put, 0));
    let mut got = [0u8; 8];
    m.window.read(8192, &mut got);
    assert_eq!(got, [0x5a; 8]);
    // A host source takes lb-a for small PUTs.
    let before_a = m.a.log().len();
    m.run(&[m.put(0, 8200, 8, 2)]);
    assert_eq!(m.a.log().len(), before_a + 1);
    drop(m);
    drop(device);
}

#[test]
fn a_user_flush_waits_for_every_driver() {
    let mut m = mixed();
    m.src.write(0, &[7; BIG as usize]);
    let flush = Sqe::flush(m.ep).with_user_data(9);
    let cqes = m.run(&[m.put(0, 0, 8, 1), m.put(0, 2048, BIG, 2), flush]);
    // The FLUSH completes last: after lb-b's PUT, which completes at the
    // next poll.
    assert_eq!(cqes.last().unwrap().user_data, 9);
    let mut got = vec![0u8; BIG as usize];
    m.window.read(2048, &mut got);
    assert!(got.iter().all(|&b| b == 7));
    assert_eq!(m.a.flushes().last().unwrap().1, 0b1);
    assert_eq!(
        m.b.flushes().last().unwrap().1,
        0b10,
        "lb-b's first bandwidth lane"
    );
}

#[test]
fn a_flush_part_that_fails_fails_the_endpoint_and_everything_completes_once() {
    let mut m = mixed();
    m.b.fail_flush(0, Status::Transport);
    let sqes = [
        m.put(0, 0, 8, 1),
        m.put(0, 2048, BIG, 2),
        Sqe::fence(m.ep, FenceMode::COMPLETE).with_user_data(3),
        m.put(0, 16, 8, 4),
        m.put(0, 24, 8, 5),
    ];
    let cqes = run(&m.initiator, &mut m.qp, &sqes, sqes.len());
    let res = |ud: u64| cqes.iter().find(|c| c.user_data == ud).unwrap().res;
    assert!(res(1) >= 0 && res(2) >= 0 && res(3) >= 0);
    assert_eq!(res(4), Status::Transport.as_raw());
    assert_eq!(res(5), Status::Transport.as_raw());
    let mut users: Vec<u64> = cqes.iter().map(|c| c.user_data).collect();
    users.sort_unstable();
    assert_eq!(users, vec![1, 2, 3, 4, 5]);
}
