//! Finding 4 of the adversarial suite: a driver that re-enters its worker
//! from inside `post` panics with a message instead of deadlocking.

use ringfence::{CompletionMode, DriverEp, Loopback, Worker};
use ringfence_ring::{RemoteBuf, Sqe};
use std::sync::{Arc, Mutex};

/// Finding 4: a driver that calls back into its worker (here `progress`
/// from inside `post`) gets a panic naming the rule, not a silent
/// deadlock.
#[test]
fn a_driver_that_reenters_its_worker_panics_with_a_message() {
    let hook: Hook = Arc::new(Mutex::new(None));
    let worker = Arc::new(
        Worker::builder()
            .driver(Reentrant {
                inner: Loopback::with_mode(CompletionMode::Immediate),
                hook: hook.clone(),
            })
            .ignore_env()
            .build()
            .unwrap(),
    );
    let target = Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .unwrap();
    let window = target.alloc_registered(64).unwrap();
    let ep = worker.connect(target.address()).unwrap();
    let rkey = worker
        .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = worker.alloc_registered(64).unwrap();
    let mut qp = worker.create_queue().unwrap();
    let w = worker.clone();
    *hook.lock().unwrap() = Some(Box::new(move || {
        w.progress();
    }));
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr(),
    };
    qp.push(Sqe::put(ep.as_raw(), src.local(0), remote, 8))
        .unwrap();
    qp.submit();
    let w = worker.clone();
    let panic = std::thread::spawn(move || w.progress())
        .join()
        .expect_err("re-entry went unnoticed");
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(
        message.contains("entered again") && message.contains("drivers must never call the engine"),
        "{message}"
    );
    // The panic left the round half done: the engine is not used again
    // (its teardown would run on that state).
    std::mem::forget(worker);
}

type Hook = Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>;

/// Loopback, whose `post` runs a hook once: a driver that breaks the
/// contract.
struct Reentrant {
    inner: Loopback,
    hook: Hook,
}

impl std::fmt::Debug for Reentrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reentrant")
    }
}

impl ringfence::Driver for Reentrant {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> ringfence::Capabilities {
        self.inner.capabilities()
    }
    fn attach(&mut self, ctx: ringfence::DriverContext) {
        self.inner.attach(ctx);
    }
    fn address(&self) -> Vec<u8> {
        self.inner.address()
    }
    fn connect(
        &mut self,
        peer: &[u8],
        lanes: u8,
        token: ringfence::Token,
    ) -> Result<ringfence::Connect, ringfence::DriverError> {
        self.inner.connect(peer, lanes, token)
    }
    fn disconnect(&mut self, ep: DriverEp) {
        self.inner.disconnect(ep);
    }
    fn register(
        &mut self,
        mem: &ringfence::MemDesc,
        prepared: ringfence::Prepared,
    ) -> Result<ringfence::Registered, ringfence::DriverError> {
        self.inner.register(mem, prepared)
    }
    fn deregister(&mut self, key: ringfence::DriverMemKey) {
        self.inner.deregister(key);
    }
    fn pack_rkey(&self, key: ringfence::DriverMemKey) -> Result<Vec<u8>, ringfence::DriverError> {
        self.inner.pack_rkey(key)
    }
    fn unpack_rkey(
        &mut self,
        ep: DriverEp,
        part: &ringfence::KeyPart<'_>,
        prepared: ringfence::Prepared,
    ) -> Result<ringfence::Unpacked, ringfence::DriverError> {
        self.inner.unpack_rkey(ep, part, prepared)
    }
    unsafe fn post(
        &mut self,
        ep: DriverEp,
        op: &ringfence::Op,
        token: ringfence::Token,
    ) -> ringfence::Posted {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.inner.post(ep, op, token) }
    }
    fn flush(&mut self, ep: DriverEp, lanes: u64, token: ringfence::Token) -> ringfence::Posted {
        self.inner.flush(ep, lanes, token)
    }
    fn poll(&mut self, out: &mut [ringfence::Completion]) -> usize {
        self.inner.poll(out)
    }
}
