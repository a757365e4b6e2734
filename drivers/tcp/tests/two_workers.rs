//! Two workers over loopback TCP in one process, both progressed by the
//! test: PUT, GET, atomics, notifications, flushes and fences.

use ringfence::{Cqe, EndpointId, EndpointState, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe};
use ringfence_tcp::Tcp;
use std::time::{Duration, Instant};

fn worker() -> Worker {
    Worker::builder()
        .driver(Tcp::builder().ignore_env().build().unwrap())
        .notify_buffers(8, 256)
        .ignore_env()
        .build()
        .unwrap()
}

/// Submits `sqes`, runs both workers' progress until `expect` CQEs came.
fn run(w: &Worker, other: &Worker, qp: &mut QueuePair, sqes: &[Sqe], expect: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pushed = 0;
    let mut out = Vec::new();
    while out.len() < expect {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        w.progress();
        other.progress();
        let mut batch = [Cqe::default(); 64];
        let n = qp.reap(&mut batch).unwrap();
        out.extend_from_slice(&batch[..n]);
        assert!(Instant::now() < deadline, "hung: {} of {expect}", out.len());
        if out.len() < expect {
            std::thread::yield_now();
        }
    }
    out
}

struct Pair {
    target: Worker,
    initiator: Worker,
    window: RegisteredBuf,
    ep: EndpointId,
    rkey: RkeyId,
}

fn pair(len: usize, lanes: u8) -> Pair {
    let target = worker();
    let initiator = worker();
    let window = target.alloc_registered(len).unwrap();
    let ep = initiator
        .connect_lanes(target.address(), &[("tcp", lanes)])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while initiator.endpoint_state(ep).unwrap() == EndpointState::Connecting {
        initiator.progress();
        target.progress();
        assert!(Instant::now() < deadline, "connect hung");
        std::thread::yield_now();
    }
    assert_eq!(
        initiator.endpoint_state(ep).unwrap(),
        EndpointState::Connected
    );
    let blob = target.pack_rkey(window.handle()).unwrap();
    let rkey = initiator.unpack_rkey(ep, &blob).unwrap();
    Pair {
        target,
        initiator,
        window,
        ep,
        rkey,
    }
}

#[test]
fn put_get_atomic_notify() {
    let p = pair(1 << 16, 1);
    let src = p.initiator.alloc_registered(4096).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let mut tq = p.target.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let remote = |off: u64| RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr() + off,
    };
    src.write(0, b"hello, tcp");
    let mut notify = Sqe::notify(ep, src.local(0), 5).with_user_data(6);
    notify.operand = 66;
    let sqes = [
        Sqe::put(ep, src.local(0), remote(100), 10).with_user_data(1),
        Sqe::fence(ep, FenceMode::STRONG).with_user_data(2),
        Sqe::get(ep, src.local(1000), remote(100), 10).with_user_data(3),
        Sqe::atomic_fadd(ep, src.local(2048), remote(8), 5).with_user_data(4),
        Sqe::atomic_fadd(ep, src.local(2056), remote(8), 5).with_user_data(5),
        notify,
        Sqe::flush(ep).with_user_data(7),
    ];
    let cqes = run(&p.initiator, &p.target, &mut qp, &sqes, sqes.len());
    for c in &cqes {
        assert!(c.res >= 0, "{c:?}");
    }
    let mut out = [0u8; 10];
    p.window.read(100, &mut out);
    assert_eq!(&out, b"hello, tcp");
    src.read(1000, &mut out);
    assert_eq!(&out, b"hello, tcp");
    assert_eq!(p.window.load_u64(8), 10);
    assert_eq!(src.load_u64(2048) + src.load_u64(2056), 5);
    let deadline = Instant::now() + Duration::from_secs(10);
    let cqe = loop {
        p.target.progress();
        if let Some(c) = tq.pop().unwrap() {
            break c;
        }
        assert!(Instant::now() < deadline);
    };
    assert_eq!(cqe.user_data, 66, "the tag");
    assert_eq!(&*tq.notification(&cqe).unwrap(), b"hello");
}
