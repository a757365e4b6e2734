//! Helpers for the shm driver's cross-process tests: a framed message link
//! between parent and child, shm workers, and running SQEs to completion
//! with bounded, yielding waits.

use crate::{Backoff, Deadline};
use ringfence::{Cqe, EndpointId, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::Sqe;
use ringfence_shm::Shm;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The limit every wait in these tests runs under: only catches hangs.
pub const HANG: Duration = Duration::from_secs(300);

/// Length-prefixed messages over the parent–child socket.
#[derive(Debug)]
pub struct Link {
    stream: UnixStream,
    /// Bytes read but not yet returned as a whole message.
    pending: Vec<u8>,
}

impl Link {
    /// A link over `stream`.
    pub fn new(stream: UnixStream) -> Link {
        Link {
            stream,
            pending: Vec::new(),
        }
    }

    /// Sends one message.
    ///
    /// # Panics
    /// If the socket fails.
    pub fn send(&mut self, message: &[u8]) {
        self.stream.set_nonblocking(false).expect("blocking mode");
        let mut framed = (message.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(message);
        self.stream
            .write_all(&framed)
            .expect("sending to the other process");
    }

    /// Sends the concatenation of `u64`s.
    pub fn send_u64s(&mut self, values: &[u64]) {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.send(&bytes);
    }

    fn take(&mut self) -> Option<Vec<u8>> {
        let len = u32::from_le_bytes(self.pending.get(..4)?.try_into().ok()?) as usize;
        if self.pending.len() < 4 + len {
            return None;
        }
        let message = self.pending[4..4 + len].to_vec();
        self.pending.drain(..4 + len);
        Some(message)
    }

    /// The next message, waiting for it.
    ///
    /// # Panics
    /// If the other process hung up or the socket fails.
    pub fn recv(&mut self) -> Vec<u8> {
        self.stream.set_nonblocking(false).expect("blocking mode");
        loop {
            if let Some(m) = self.take() {
                return m;
            }
            let mut buf = [0u8; 4096];
            let n = self
                .stream
                .read(&mut buf)
                .expect("reading from the other process");
            assert!(n > 0, "the other process hung up");
            self.pending.extend_from_slice(&buf[..n]);
        }
    }

    /// The next message if one is there, without waiting.
    ///
    /// # Panics
    /// If the other process hung up or the socket fails.
    pub fn try_recv(&mut self) -> Option<Vec<u8>> {
        if let Some(m) = self.take() {
            return Some(m);
        }
        self.stream
            .set_nonblocking(true)
            .expect("non-blocking mode");
        let mut buf = [0u8; 4096];
        match self.stream.read(&mut buf) {
            Ok(0) => panic!("the other process hung up"),
            Ok(n) => self.pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("reading from the other process: {e}"),
        }
        self.take()
    }

    /// The next message as `u64`s.
    ///
    /// # Panics
    /// As [`recv`](Link::recv), or if the length is not a multiple of 8.
    pub fn recv_u64s(&mut self) -> Vec<u64> {
        let m = self.recv();
        assert_eq!(m.len() % 8, 0, "not a list of u64");
        m.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }

    /// Sends what [`recv_offer`](Link::recv_offer) takes: `worker`'s
    /// address, the packed key of `window`, and its base address.
    ///
    /// # Panics
    /// If packing the key or sending fails.
    pub fn send_offer(&mut self, worker: &Worker, window: &RegisteredBuf) {
        self.send(worker.address());
        self.send(&worker.pack_rkey(window.handle()).expect("pack the window"));
        self.send_u64s(&[window.addr()]);
    }

    /// What a target child sends first: its worker address, its window's
    /// packed key, and facts about the window (its base address first).
    ///
    /// # Panics
    /// As [`recv`](Link::recv).
    pub fn recv_offer(&mut self) -> Offer {
        let (address, key) = (self.recv(), self.recv());
        Offer {
            address,
            key,
            window: self.recv_u64s(),
        }
    }
}

/// A target's offer: see [`Link::recv_offer`].
#[derive(Debug)]
pub struct Offer {
    /// The target worker's address.
    pub address: Vec<u8>,
    /// The packed key of its window.
    pub key: Vec<u8>,
    /// Facts about the window; the first is its base address.
    pub window: Vec<u64>,
}

impl Offer {
    /// The window's base address.
    ///
    /// # Panics
    /// If the target sent no window facts.
    pub fn base(&self) -> u64 {
        self.window[0]
    }

    /// Connects `worker` to the target: the endpoint and the window's key.
    ///
    /// # Panics
    /// If connecting or unpacking fails.
    pub fn connect(&self, worker: &Worker) -> (EndpointId, RkeyId) {
        let ep = worker
            .connect(&self.address)
            .expect("connect to the target");
        let rkey = worker
            .unpack_rkey(ep, &self.key)
            .expect("unpack the window's key");
        (ep, rkey)
    }
}

/// A worker with one shm driver, 1024 requests per queue pair, `lanes`
/// lanes, and 64 notification buffers of 4 KiB.
///
/// # Panics
/// If the worker cannot be built.
pub fn worker(lanes: u8) -> Worker {
    Worker::builder()
        .driver(Shm::new().expect("shm driver"))
        .lanes(lanes)
        .bw_threshold(1024)
        .requests(1024)
        .notify_buffers(64, 4096)
        .ignore_env()
        .build()
        .expect("worker")
}

/// Pushes `sqes` and runs `worker`'s progress until `expect` CQEs arrived
/// (reaping as it goes); returns them in arrival order.
///
/// # Panics
/// If they do not all arrive within [`HANG`].
pub fn complete(worker: &Worker, qp: &mut QueuePair, sqes: &[Sqe], expect: usize) -> Vec<Cqe> {
    let deadline = Deadline::after(HANG, "completing SQEs");
    let mut backoff = Backoff::default();
    let mut pushed = 0;
    let mut out = Vec::with_capacity(expect);
    let mut batch = [Cqe::default(); 64];
    while out.len() < expect {
        let mut work = 0;
        if pushed < sqes.len() {
            let n = qp.push_batch(&sqes[pushed..]).expect("SQ indices");
            pushed += n;
            qp.submit();
            work += n;
        }
        work += worker.progress();
        let n = qp.reap(&mut batch).expect("CQ indices");
        out.extend_from_slice(&batch[..n]);
        work += n;
        if work > 0 {
            backoff.reset();
        } else {
            backoff.idle();
        }
        deadline.check(|| format!("{} of {expect} CQEs ({pushed} pushed)", out.len()));
    }
    out
}

/// A deterministic byte pattern for `seed` (xorshift, 8 bytes a step).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// FNV-1a over `bytes`.
pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The shm driver's part of a worker address (the last part; these tests
/// build workers with the shm driver only): `"SHM1"` + socket name, then
/// the address's integrity check.
///
/// # Panics
/// If the address has no shm part.
pub fn shm_socket_name(address: &[u8]) -> Vec<u8> {
    let at = address
        .windows(4)
        .position(|w| w == b"SHM1")
        .expect("an shm address part");
    // The part runs to the address's 4-byte integrity check.
    address[at + 4..address.len() - 4].to_vec()
}
