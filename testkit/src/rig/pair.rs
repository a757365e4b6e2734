//! [`Pair`]: two workers of one driver, connected, with the loops that
//! progress both.

use super::{Wait, assert_exactly_once, assert_quiet, drive};
use ringfence::{
    Capabilities, Driver, EndpointId, EndpointState, QueuePair, RegisteredBuf, RkeyId, Worker,
};
use ringfence_ring::{Cqe, RemoteBuf, Sqe};
use std::collections::HashMap;

/// How the two workers of a [`Pair`] are built.
#[derive(Debug, Clone, Copy)]
pub struct PairConfig {
    /// Lanes per endpoint (capped by the driver).
    pub lanes: u8,
    /// The PUT and GET size from which the bandwidth lanes are used.
    pub bw_threshold: u32,
    /// Bytes of the target's window.
    pub window: usize,
    /// Bytes of the initiator's local buffer.
    pub local: usize,
    /// Notification buffers of each worker: count and size.
    pub notify: (u32, u32),
}

impl Default for PairConfig {
    /// Four lanes (small operations on lane 0, those from 4 KiB on the
    /// others), a 2 MiB window and local buffer, 16 notification buffers
    /// of 1 KiB.
    fn default() -> PairConfig {
        PairConfig {
            lanes: 4,
            bw_threshold: 4096,
            window: 2 << 20,
            local: 2 << 20,
            notify: (16, 1024),
        }
    }
}

/// Two workers, each with one driver from the same maker, the initiator
/// connected to the target and holding the key of the target's window:
/// the set-up of a driver's conformance checks (and of any test of one
/// endpoint between two workers). Its loops progress both workers, so it
/// serves drivers whose target must progress (tcp) as well as those whose
/// target need not (loopback, shm).
#[derive(Debug)]
pub struct Pair {
    /// The initiator.
    pub initiator: Worker,
    target: Option<Worker>,
    /// The target's window (zeroed at first).
    pub window: RegisteredBuf,
    /// The initiator's local buffer (zeroed at first).
    pub local: RegisteredBuf,
    /// The initiator's endpoint to the target.
    pub ep: EndpointId,
    /// The initiator's key of the window.
    pub rkey: RkeyId,
    /// The initiator's queue pair.
    pub qp: QueuePair,
    /// The target's first queue pair: it receives the notifications.
    target_qp: Option<QueuePair>,
    /// The capabilities of the initiator's driver.
    pub caps: Capabilities,
    /// How it was built.
    pub config: PairConfig,
}

impl Pair {
    /// Builds the target (its window, its queue pair) and the initiator
    /// with a driver each from `driver`, connects the initiator (waiting,
    /// progressing both, until the endpoint is up) and unpacks the
    /// window's key.
    ///
    /// # Panics
    /// If building, registering, connecting or unpacking fails, or the
    /// connection does not come up within [`HANG`](crate::HANG).
    pub fn connect<D: Driver>(mut driver: impl FnMut() -> D, config: PairConfig) -> Pair {
        let build = |d: D| {
            Worker::builder()
                .driver(d)
                .lanes(config.lanes)
                .bw_threshold(config.bw_threshold)
                .ring_entries(256, 512)
                .requests(1024)
                .notify_buffers(config.notify.0, config.notify.1)
                .ignore_env()
                .build()
                .expect("a worker")
        };
        let target = build(driver());
        let window = target
            .alloc_registered(config.window)
            .expect("the target's window");
        // Created first: it receives the notifications.
        let target_qp = target.create_queue().expect("the target's queue pair");
        let d = driver();
        let caps = d.capabilities();
        let initiator = build(d);
        let local = initiator
            .alloc_registered(config.local)
            .expect("the initiator's buffer");
        let qp = initiator
            .create_queue()
            .expect("the initiator's queue pair");
        let ep = initiator
            .connect(target.address())
            .expect("connect to the target");
        let mut wait = Wait::new("connecting");
        loop {
            match initiator.endpoint_state(ep).expect("the endpoint") {
                EndpointState::Connecting => {}
                EndpointState::Connected => break,
                other => panic!("the endpoint did not come up: {other:?}"),
            }
            let work = initiator.progress() + target.progress();
            wait.round(work > 0, String::new);
        }
        let key = target.pack_rkey(window.handle()).expect("pack the window");
        let rkey = initiator.unpack_rkey(ep, &key).expect("unpack the window");
        Pair {
            initiator,
            target: Some(target),
            window,
            local,
            ep,
            rkey,
            qp,
            target_qp: Some(target_qp),
            caps,
            config,
        }
    }

    /// The target worker.
    ///
    /// # Panics
    /// After [`kill_target`](Pair::kill_target).
    pub fn target(&self) -> &Worker {
        self.target.as_ref().expect("the target was killed")
    }

    /// The endpoint, raw, for SQE builders.
    pub fn e(&self) -> u32 {
        self.ep.as_raw()
    }

    /// `offset` bytes into the target's window, through the initiator's
    /// key.
    pub fn remote(&self, offset: u64) -> RemoteBuf {
        RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.window.addr() + offset,
        }
    }

    /// One progress round of each worker still alive; the work done.
    pub fn progress(&self) -> usize {
        self.initiator.progress() + self.target.as_ref().map_or(0, Worker::progress)
    }

    /// Submits `sqes` on the initiator's queue pair and progresses both
    /// workers until each has its CQE, then some more rounds; checks that
    /// each completed exactly once ([`assert_exactly_once`]) and returns
    /// the CQEs in completion order.
    ///
    /// # Panics
    /// If they do not complete within [`HANG`](crate::HANG), or not exactly once.
    #[track_caller]
    pub fn complete(&mut self, sqes: &[Sqe]) -> Vec<Cqe> {
        self.complete_watching(sqes, |_| {})
    }

    /// [`complete`](Pair::complete), calling `each` with every CQE as it
    /// is reaped (before later ones are), to look at memory at that
    /// moment.
    #[track_caller]
    pub fn complete_watching(&mut self, sqes: &[Sqe], mut each: impl FnMut(&Cqe)) -> Vec<Cqe> {
        let workers: Vec<&Worker> = std::iter::once(&self.initiator)
            .chain(self.target.as_ref())
            .collect();
        let out = drive(&workers, &mut self.qp, sqes, sqes.len(), &mut each);
        assert_quiet(&workers, &mut self.qp);
        assert_exactly_once(sqes, &out);
        out
    }

    /// Pushes and submits `sqes` on the initiator's queue pair, without
    /// progress; [`reap`](Pair::reap) collects their CQEs.
    ///
    /// # Panics
    /// If they do not fit in the SQ.
    pub fn submit(&mut self, sqes: &[Sqe]) {
        let pushed = self.qp.push_batch(sqes).expect("push");
        assert_eq!(pushed, sqes.len(), "the SQ is full");
        self.qp.submit();
    }

    /// Progresses the workers still alive until the initiator's queue
    /// pair has `expect` CQEs, then some more rounds in which no other may
    /// come; returns them in completion order.
    ///
    /// # Panics
    /// If they do not come within [`HANG`](crate::HANG), or one more comes.
    pub fn reap(&mut self, expect: usize) -> Vec<Cqe> {
        let workers: Vec<&Worker> = std::iter::once(&self.initiator)
            .chain(self.target.as_ref())
            .collect();
        let out = drive(&workers, &mut self.qp, &[], expect, &mut |_| {});
        assert_quiet(&workers, &mut self.qp);
        out
    }

    /// [`complete`](Pair::complete), then each CQE's `res` by the
    /// `user_data` of its SQE, in the SQEs' order.
    #[track_caller]
    pub fn results(&mut self, sqes: &[Sqe]) -> Vec<i32> {
        let cqes = self.complete(sqes);
        let res: HashMap<u64, i32> = cqes.iter().map(|c| (c.user_data, c.res)).collect();
        sqes.iter().map(|s| res[&s.user_data]).collect()
    }

    /// Progresses both workers until `done` holds.
    ///
    /// # Panics
    /// If it does not within [`HANG`](crate::HANG), naming `what`.
    #[track_caller]
    pub fn until(&mut self, what: &'static str, mut done: impl FnMut(&mut Pair) -> bool) {
        let mut wait = Wait::new(what);
        while !done(self) {
            let work = self.progress();
            wait.round(work > 0, String::new);
        }
    }

    /// The next notification the target receives (progressing both
    /// workers until it comes): its CQE and a copy of its payload.
    ///
    /// # Panics
    /// If none comes within [`HANG`](crate::HANG), or the target was killed.
    pub fn next_notification(&mut self) -> (Cqe, Vec<u8>) {
        let mut wait = Wait::new("a notification at the target");
        loop {
            let work = self.progress();
            let qp = self.target_qp.as_mut().expect("the target was killed");
            if let Some(cqe) = qp.pop().expect("pop at the target") {
                let payload = qp
                    .notification(&cqe)
                    .map(|n| n.to_vec())
                    .unwrap_or_else(|| panic!("not a notification: {cqe:?}"));
                return (cqe, payload);
            }
            wait.round(work > 0, String::new);
        }
    }

    /// Drops the target worker (and its queue pair): the peer dies. Its
    /// window's memory stays mapped while [`window`](Pair::window) lives.
    pub fn kill_target(&mut self) {
        self.target_qp = None;
        self.target = None;
    }
}
