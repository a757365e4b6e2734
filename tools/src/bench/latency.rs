//! `--mode latency`: a ping-pong of PUTs with each side polling its own
//! window, as `ucx_perftest -t ucp_put_lat` does.
//!
//! Both sides walk the same schedule: for each block size, `warmup +
//! iters` round trips. Round trip `seq` (counting from 1 across the whole
//! run) is a PUT of `size` bytes whose last 8 bytes hold `seq`, into offset
//! 0 of the peer's window; the peer spins on the word at `size - 8` until
//! it reads `seq`, then answers with the same PUT the other way. A word at
//! `size - 8` is never written by a smaller size's PUTs (they cover
//! `[0, size / 2)`), and `seq` only grows, so a stale value never matches.
//! The initiator times each round trip and records half of it.

use crate::bench::error::BenchError;
use crate::bench::stats::{LatencyRow, Samples};
use crate::bench::target::Connection;
use ringfence::{EndpointId, QueuePair, RegisteredBuf, Worker};
use ringfence_ring::{RemoteBuf, Sqe, SqeFlags, strerror};
use std::time::{Duration, Instant};

/// How long a side waits for the other's PUT before giving up.
const HANG: Duration = Duration::from_secs(60);

/// Spins on the window between two looks at the CQ (and progress rounds,
/// when inline) where the peer's PUT lands by itself (shm, loopback).
pub const SPINS_PER_POLL: u32 = 1024;

/// Who progresses a side's worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polling {
    /// Another thread: the worker's core thread.
    CoreThread,
    /// This thread: after each PUT, and every `n`-th spin on the window.
    /// `n` is 1 where this side's own progress carries out the peer's PUT
    /// (tcp), [`SPINS_PER_POLL`] where the PUT lands by itself.
    Inline(u32),
}

impl Polling {
    /// The polling of a side over `driver`: inline or by the core thread.
    pub fn of(driver: crate::bench::cli::DriverKind, inline: bool) -> Polling {
        match (inline, driver.target_executes()) {
            (false, _) => Polling::CoreThread,
            (true, true) => Polling::Inline(1),
            (true, false) => Polling::Inline(SPINS_PER_POLL),
        }
    }

    fn is_inline(self) -> bool {
        matches!(self, Polling::Inline(_))
    }
}

/// One side of the ping-pong: a connection to the peer's window, a source
/// buffer, and its own window that the peer writes.
#[derive(Debug)]
pub struct Side<'w> {
    worker: &'w Worker,
    qp: QueuePair,
    src: RegisteredBuf,
    window: RegisteredBuf,
    endpoint: EndpointId,
    ep: u32,
    remote: RemoteBuf,
    polling: Polling,
}

impl<'w> Side<'w> {
    /// Connects `worker` to the peer's window `conn`; `window` is this
    /// side's own (polled) window; PUTs are at most `max_block` bytes.
    /// Returns at once: the endpoint may still be connecting (see
    /// [`wait_connected`](Side::wait_connected)).
    ///
    /// # Errors
    /// Connecting, unpacking the key or allocating failed, or a window is
    /// too small.
    pub fn connect(
        worker: &'w Worker,
        conn: &Connection,
        window: RegisteredBuf,
        max_block: u64,
        polling: Polling,
    ) -> Result<Side<'w>, BenchError> {
        if conn.len < max_block || (window.len() as u64) < max_block {
            return Err(BenchError::Target(format!(
                "the windows ({} B here, {} B there) are smaller than a {max_block} B PUT",
                window.len(),
                conn.len
            )));
        }
        let ep = worker
            .connect(&conn.address)
            .map_err(BenchError::engine("connecting to the peer"))?;
        let rkey = worker
            .unpack_rkey(ep, &conn.rkey)
            .map_err(BenchError::engine("unpacking the peer's key"))?;
        let src = worker
            .alloc_registered(max_block as usize)
            .map_err(BenchError::engine("allocating the source buffer"))?;
        let qp = worker
            .create_queue()
            .map_err(BenchError::engine("creating a queue pair"))?;
        Ok(Side {
            worker,
            qp,
            src,
            window,
            endpoint: ep,
            ep: ep.as_raw(),
            remote: RemoteBuf {
                rkey: rkey.as_raw(),
                addr: conn.base,
            },
            polling,
        })
    }

    /// Waits until the endpoint to the peer is up (the peer must be
    /// progressing meanwhile).
    ///
    /// # Errors
    /// The handshake failed or did not finish in time.
    pub fn wait_connected(&self) -> Result<(), BenchError> {
        crate::bench::wait_connected(self.worker, self.endpoint, self.polling.is_inline())
    }

    /// PUTs `size` bytes whose last word is `seq`.
    fn put(&mut self, size: u64, seq: u64) -> Result<(), BenchError> {
        self.src.write(size as usize - 8, &seq.to_le_bytes());
        let sqe = Sqe::put(self.ep, self.src.local(0), self.remote, size as u32)
            .with_flags(SqeFlags::SKIP_SUCCESS);
        while self.qp.push(sqe).is_err() {
            self.check_errors()?;
        }
        self.qp.submit();
        if self.polling.is_inline() {
            self.worker.progress();
        }
        Ok(())
    }

    /// Reaps CQEs: with SKIP_SUCCESS, any CQE is a failed PUT.
    fn check_errors(&mut self) -> Result<(), BenchError> {
        if self.polling.is_inline() {
            self.worker.progress();
        }
        match self.qp.pop() {
            Ok(None) => Ok(()),
            Ok(Some(c)) => Err(BenchError::Completion {
                op: "PUT",
                status: strerror(c.res).into(),
            }),
            Err(e) => Err(BenchError::Target(format!("CQ: {e}"))),
        }
    }

    /// Spins until the word at `size - 8` of this side's window is `seq`.
    fn wait(&mut self, size: u64, seq: u64) -> Result<(), BenchError> {
        let at = size as usize - 8;
        let every = match self.polling {
            Polling::Inline(n) => n.max(1),
            Polling::CoreThread => SPINS_PER_POLL,
        };
        let mut spins = 0u32;
        let mut deadline = None;
        while self.window.load_u64(at) != seq {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(every) {
                self.check_errors()?;
            } else {
                std::hint::spin_loop();
            }
            if spins.is_multiple_of(SPINS_PER_POLL) {
                let d = *deadline.get_or_insert_with(|| Instant::now() + HANG);
                if Instant::now() > d {
                    return Err(BenchError::Hang(format!(
                        "no answer to round trip {seq} ({size} B) within {HANG:?}"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The initiator's side: `warmup + iters` timed round trips per size; one
/// row per size.
///
/// # Errors
/// A PUT failed or the peer stopped answering.
pub fn ping(
    side: &mut Side<'_>,
    sizes: &[u64],
    warmup: u64,
    iters: u64,
    mut on_row: impl FnMut(&LatencyRow),
) -> Result<Vec<LatencyRow>, BenchError> {
    let mut seq = 0u64;
    let mut rows = Vec::with_capacity(sizes.len());
    for &size in sizes {
        let mut one_way = Samples::default();
        for round in 0..warmup + iters {
            seq += 1;
            let start = Instant::now();
            side.put(size, seq)?;
            side.wait(size, seq)?;
            if round >= warmup {
                one_way.record(start.elapsed() / 2);
            }
        }
        let row = LatencyRow::new(size, &one_way);
        on_row(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// The answering side: `rounds` round trips per size.
///
/// # Errors
/// A PUT failed or the initiator stopped sending.
pub fn pong(side: &mut Side<'_>, sizes: &[u64], rounds: u64) -> Result<(), BenchError> {
    let mut seq = 0u64;
    for &size in sizes {
        for _ in 0..rounds {
            seq += 1;
            side.wait(size, seq)?;
            side.put(size, seq)?;
        }
    }
    Ok(())
}
