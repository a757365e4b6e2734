//! A progress round is bounded: a driver whose `poll` always returns a
//! full batch cannot keep the engine from taking SQEs.

use ringfence::{
    Capabilities, Completion, Connect, Driver, DriverContext, DriverEp, DriverError, DriverMemKey,
    KeyPart, LaneMask, Loopback, MemDesc, Op, Posted, Prepared, Registered, Token, Unpacked,
    Worker,
};
use ringfence_ring::{RemoteBuf, Sqe};
use std::time::{Duration, Instant};

/// Loopback, except that `poll` fills whatever room it has left with
/// completions that name nothing (the engine counts them as stray): an
/// endless stream, as from a driver with a deep completion queue.
#[derive(Debug)]
struct Flood {
    inner: Loopback,
    polls: u64,
}

impl Driver for Flood {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn attach(&mut self, ctx: DriverContext) {
        self.inner.attach(ctx);
    }
    fn address(&self) -> Vec<u8> {
        self.inner.address()
    }
    fn connect(&mut self, peer: &[u8], lanes: u8, token: Token) -> Result<Connect, DriverError> {
        self.inner.connect(peer, lanes, token)
    }
    fn disconnect(&mut self, ep: DriverEp) {
        self.inner.disconnect(ep);
    }
    fn register(&mut self, mem: &MemDesc, prepared: Prepared) -> Result<Registered, DriverError> {
        self.inner.register(mem, prepared)
    }
    fn deregister(&mut self, key: DriverMemKey) {
        self.inner.deregister(key);
    }
    fn pack_rkey(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError> {
        self.inner.pack_rkey(key)
    }
    fn unpack_rkey(
        &mut self,
        ep: DriverEp,
        part: &KeyPart<'_>,
        prepared: Prepared,
    ) -> Result<Unpacked, DriverError> {
        self.inner.unpack_rkey(ep, part, prepared)
    }
    #[allow(unsafe_code)]
    unsafe fn post(&mut self, ep: DriverEp, op: &Op, token: Token) -> Posted {
        // SAFETY: forwarded under the engine's own guarantee.
        unsafe { self.inner.post(ep, op, token) }
    }
    fn flush(&mut self, ep: DriverEp, lanes: LaneMask, token: Token) -> Posted {
        self.inner.flush(ep, lanes, token)
    }
    fn poll(&mut self, out: &mut [Completion]) -> usize {
        self.polls += 1;
        let n = self.inner.poll(out);
        for slot in &mut out[n..] {
            *slot = Completion::new(Token::NONE, Ok(0));
        }
        out.len()
    }
}

#[test]
fn a_flooding_driver_does_not_starve_the_sq() {
    let target = Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .unwrap();
    let initiator = Worker::builder()
        .driver(Flood {
            inner: Loopback::new(),
            polls: 0,
        })
        .ignore_env()
        .build()
        .unwrap();
    let window = target.alloc_registered(4096).unwrap();
    let ep = initiator.connect(target.address()).unwrap();
    let rkey = initiator
        .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = initiator.alloc_registered(64).unwrap();
    src.write(0, b"through the flood");
    let mut qp = initiator.create_queue().unwrap();
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr(),
    };
    qp.push(Sqe::nop().with_user_data(1)).unwrap();
    qp.push(Sqe::put(ep.as_raw(), src.local(0), remote, 17).with_user_data(2))
        .unwrap();
    qp.push(Sqe::flush(ep.as_raw()).with_user_data(3)).unwrap();
    qp.submit();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut done = Vec::new();
    while done.len() < 3 {
        // Each call returns: the round polls the flooding driver a bounded
        // number of times.
        initiator.progress();
        while let Some(cqe) = qp.pop().unwrap() {
            assert!(cqe.res >= 0, "{cqe:?}");
            done.push(cqe.user_data);
        }
        assert!(Instant::now() < deadline, "the SQ was starved: {done:?}");
    }
    done.sort_unstable();
    assert_eq!(done, vec![1, 2, 3]);
    let mut out = [0u8; 17];
    window.read(0, &mut out);
    assert_eq!(&out, b"through the flood");
}
