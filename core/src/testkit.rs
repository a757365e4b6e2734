//! Setups the engine's tests share (with the `testkit` feature).

use crate::{EndpointId, Loopback, RegisteredBuf, RkeyId, Worker};

/// A loopback target worker exposing a registered window, connected from an
/// initiator whose endpoint and unpacked key of the window are at hand.
#[derive(Debug)]
pub struct LoopbackTarget {
    /// The target worker (one loopback driver); dropping it is the peer's
    /// death.
    pub worker: Worker,
    /// Its registered window.
    pub window: RegisteredBuf,
    /// The initiator's endpoint to it.
    pub ep: EndpointId,
    /// The initiator's key of the window.
    pub rkey: RkeyId,
}

impl LoopbackTarget {
    /// A target with a `window`-byte window, connected from `initiator`
    /// (which must have a loopback driver, possibly wrapped).
    ///
    /// # Panics
    /// If building, registering, connecting or unpacking fails.
    pub fn connect(initiator: &Worker, window: usize) -> LoopbackTarget {
        let worker = Worker::builder()
            .driver(Loopback::new())
            .ignore_env()
            .build()
            .expect("loopback target worker");
        let window = worker.alloc_registered(window).expect("target window");
        let ep = initiator
            .connect(worker.address())
            .expect("connect to the target");
        let key = worker.pack_rkey(window.handle()).expect("pack the window");
        let rkey = initiator.unpack_rkey(ep, &key).expect("unpack the window");
        LoopbackTarget {
            worker,
            window,
            ep,
            rkey,
        }
    }
}
