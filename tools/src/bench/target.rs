//! The target side: a worker exposing a window, the consistency checks it
//! runs on that window, and the ways the initiator reaches it: in this
//! process ([`LocalTarget`], loopback), a child process ([`ChildTarget`],
//! shm and tcp) that speaks a line protocol on its standard input and
//! output, or a `--listen` process on the bootstrap socket
//! ([`SessionTarget`](crate::bench::bootstrap::SessionTarget), tcp), which
//! carries the same commands in frames.
//!
//! # Protocol (child target)
//! The child prints its connection string ([`Connection`]) as its first
//! line, then answers one line per command:
//!
//! | command | answer |
//! |---|---|
//! | `prepare OP BLOCK BATCH COUNT` | `ok`, or `err MESSAGE` |
//! | `verify OP BLOCK BATCH COUNT` | `ok`, or `err MESSAGE` |
//! | `pong CONNECTION WARMUP ITERS SIZE...` | `ok` once connected back; `done` after the ping-pong |
//!
//! It exits when its standard input closes. Between commands it takes its
//! incoming notifications, running its worker's progress unless a core
//! thread does (tcp: the target carries out every request itself, so its
//! core thread runs throughout), and sleeps briefly when idle so that it
//! leaves the CPU to the initiator.

use crate::bench::cli::OpKind;
use crate::bench::error::BenchError;
use ringfence::{Cqe, QueuePair, RegisteredBuf, Worker};

mod child;
mod serve;

pub use child::{ANSWER_TIMEOUT, ChildTarget, Commands};
pub use serve::{AnswerSink, serve, serve_commands};

/// What one row asks of the target: the operation, the shape of a batch,
/// and how many batches run (warm-up included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSpec {
    /// The operation.
    pub op: OpKind,
    /// Bytes per transfer.
    pub block: u64,
    /// Transfers per batch.
    pub batch: u64,
    /// Batches run, warm-up included.
    pub count: u64,
}

impl RowSpec {
    fn to_words(self) -> String {
        let op = match self.op {
            OpKind::Write => "write",
            OpKind::Read => "read",
            OpKind::Atomic => "atomic",
        };
        format!("{op} {} {} {}", self.block, self.batch, self.count)
    }

    fn from_words(words: &[&str]) -> Option<RowSpec> {
        let [op, block, batch, count] = words else {
            return None;
        };
        Some(RowSpec {
            op: match *op {
                "write" => OpKind::Write,
                "read" => OpKind::Read,
                "atomic" => OpKind::Atomic,
                _ => return None,
            },
            // A command may come from another host (`--listen`): a
            // transfer and a batch have at least one byte and one transfer.
            block: block.parse().ok().filter(|&b| b > 0)?,
            batch: batch.parse().ok().filter(|&b| b > 0)?,
            count: count.parse().ok()?,
        })
    }

    /// Bytes of the window a row's transfers touch (saturating: a row too
    /// large for any window).
    pub fn span(self) -> usize {
        usize::try_from(self.block.saturating_mul(self.batch)).unwrap_or(usize::MAX)
    }

    /// Bytes of the window a row's checks touch: its transfers, and one
    /// 8-byte word per transfer (atomics count words).
    fn checked_span(self) -> usize {
        let words = usize::try_from(self.batch.saturating_mul(8)).unwrap_or(usize::MAX);
        self.span().max(words)
    }
}

/// The byte at `pos` of a row's pattern: depends on the position, the
/// block size and the batch size, so bytes of another row never pass.
pub fn pattern_byte(spec: RowSpec, pos: usize) -> u8 {
    let p = pos as u64;
    (p.wrapping_mul(131)
        ^ (p >> 8)
        ^ (p >> 16)
        ^ (u64::from(spec.block.trailing_zeros()) * 17)
        ^ spec.batch.wrapping_mul(3)
        ^ 0x5a) as u8
}

/// The pattern of a row, `len` bytes from 0.
pub fn pattern(spec: RowSpec, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern_byte(spec, i)).collect()
}

/// Compares `got` (read from `what` at offset 0) with the row's pattern;
/// the first difference, described.
pub fn compare(spec: RowSpec, got: &[u8], what: &str) -> Result<(), BenchError> {
    match got
        .iter()
        .enumerate()
        .find(|&(i, &b)| b != pattern_byte(spec, i))
    {
        None => Ok(()),
        Some((i, &b)) => Err(BenchError::Inconsistent(format!(
            "{what} byte {i} (transfer {}, byte {} of it) is {b:#04x}, expected {:#04x} \
             (block size {}, batch size {})",
            i as u64 / spec.block,
            i as u64 % spec.block,
            pattern_byte(spec, i),
            spec.block,
            spec.batch
        ))),
    }
}

/// How an initiator reaches a target's window: its worker address, the
/// packed key, and the window's address and length in the target process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// The target worker's address.
    pub address: Vec<u8>,
    /// The packed remote key of the window.
    pub rkey: Vec<u8>,
    /// The window's start address (in the target's address space).
    pub base: u64,
    /// The window's length.
    pub len: u64,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Connection {
    /// The connection string: `rf1:ADDRESS:RKEY:BASE:LEN` (hex, hex, hex,
    /// decimal).
    pub fn encode(&self) -> String {
        format!(
            "rf1:{}:{}:{:x}:{}",
            hex(&self.address),
            hex(&self.rkey),
            self.base,
            self.len
        )
    }

    /// Parses a connection string.
    ///
    /// # Errors
    /// [`BenchError::Usage`] when malformed.
    pub fn decode(s: &str) -> Result<Connection, BenchError> {
        let bad = || {
            BenchError::Usage(format!(
                "`{s}` is not a connection string printed by `rfbench --role target`"
            ))
        };
        let parts: Vec<&str> = s.trim().split(':').collect();
        let ["rf1", address, rkey, base, len] = parts[..] else {
            return Err(bad());
        };
        Ok(Connection {
            address: unhex(address).ok_or_else(bad)?,
            rkey: unhex(rkey).ok_or_else(bad)?,
            base: u64::from_str_radix(base, 16).map_err(|_| bad())?,
            len: len.parse().map_err(|_| bad())?,
        })
    }

    /// The connection to `window` of `worker`.
    ///
    /// # Errors
    /// The key cannot be packed.
    pub fn of(worker: &Worker, window: &RegisteredBuf) -> Result<Connection, BenchError> {
        Ok(Connection {
            address: worker.address().to_vec(),
            rkey: worker
                .pack_rkey(window.handle())
                .map_err(BenchError::engine("pack_rkey"))?,
            base: window.addr(),
            len: window.len() as u64,
        })
    }
}

/// A target worker, its window, and its queue pair (which receives the
/// notifications).
#[derive(Debug)]
pub struct TargetState {
    /// The worker.
    pub worker: Worker,
    /// The window initiators write and read.
    pub window: RegisteredBuf,
    qp: QueuePair,
    corrupt: bool,
    /// The worker's core thread runs (see [`TargetState::start_core_thread`]).
    core_thread: bool,
    cqes: Vec<Cqe>,
}

impl TargetState {
    /// A window of `len` bytes on `worker`. With `corrupt`, every check
    /// first damages the window (tests of the check itself).
    ///
    /// # Errors
    /// Allocation or queue creation failed.
    pub fn new(worker: Worker, len: usize, corrupt: bool) -> Result<TargetState, BenchError> {
        let window = worker
            .alloc_registered(len)
            .map_err(BenchError::engine("allocating the target window"))?;
        let qp = worker
            .create_queue()
            .map_err(BenchError::engine("creating the target queue pair"))?;
        Ok(TargetState {
            worker,
            window,
            qp,
            corrupt,
            core_thread: false,
            cqes: vec![Cqe::default(); 64],
        })
    }

    /// Starts the worker's core thread, for a driver whose target carries
    /// out what it is sent (tcp): from then on [`service`](Self::service)
    /// only takes notifications, and a ping-pong stops the core thread
    /// while this thread polls instead.
    ///
    /// # Errors
    /// The core thread cannot be started.
    pub fn start_core_thread(&mut self) -> Result<(), BenchError> {
        self.worker
            .start_core_thread(None)
            .map_err(BenchError::engine("starting the target's core thread"))?;
        self.core_thread = true;
        Ok(())
    }

    /// Replaces the window with a new one of `len` bytes (a `--listen`
    /// target sizes it for each initiator); the old one is deregistered.
    ///
    /// # Errors
    /// The allocation failed.
    pub fn set_window(&mut self, len: usize) -> Result<(), BenchError> {
        let window = self
            .worker
            .alloc_registered(len)
            .map_err(BenchError::engine("allocating the target window"))?;
        let old = std::mem::replace(&mut self.window, window);
        if let Err(e) = self.worker.deregister(old.handle()) {
            // The memory stays allocated; nothing else is affected.
            eprintln!("rfbench target: deregistering the previous window: {e}");
        }
        Ok(())
    }

    /// The connection string of the window.
    ///
    /// # Errors
    /// The key cannot be packed.
    pub fn connection(&self) -> Result<Connection, BenchError> {
        Connection::of(&self.worker, &self.window)
    }

    fn check_span(&self, spec: RowSpec) -> Result<(), BenchError> {
        if spec.checked_span() > self.window.len() {
            return Err(BenchError::Target(format!(
                "a row of {} x {} B does not fit the {} B window",
                spec.batch,
                spec.block,
                self.window.len()
            )));
        }
        Ok(())
    }

    /// Before a row: zero the window (write, atomic) or fill it with the
    /// row's pattern (read).
    ///
    /// # Errors
    /// The row does not fit the window.
    pub fn prepare(&mut self, spec: RowSpec) -> Result<(), BenchError> {
        self.check_span(spec)?;
        let span = spec.checked_span();
        match spec.op {
            OpKind::Write | OpKind::Atomic => self.window.write(0, &vec![0u8; span]),
            OpKind::Read => {
                self.window.write(0, &pattern(spec, span));
                if self.corrupt {
                    self.damage();
                }
            }
        }
        Ok(())
    }

    fn damage(&self) {
        let mut b = [0u8; 1];
        self.window.read(0, &mut b);
        self.window.write(0, &[!b[0]]);
    }

    /// After a row: the window holds the pattern (write) or every word was
    /// added to once per batch (atomic). Reads are checked by the initiator.
    ///
    /// # Errors
    /// [`BenchError::Inconsistent`] describing the first difference.
    pub fn verify(&mut self, spec: RowSpec) -> Result<(), BenchError> {
        self.check_span(spec)?;
        if self.corrupt && spec.op != OpKind::Read {
            self.damage();
        }
        match spec.op {
            OpKind::Write => {
                let mut got = vec![0u8; spec.span()];
                self.window.read(0, &mut got);
                compare(spec, &got, "target window")
            }
            OpKind::Atomic => {
                for i in 0..spec.batch as usize {
                    let v = self.window.load_u64(8 * i);
                    if v != spec.count {
                        return Err(BenchError::Inconsistent(format!(
                            "target word {i} is {v}, expected {} (one ADD of 1 per batch)",
                            spec.count
                        )));
                    }
                }
                Ok(())
            }
            OpKind::Read => Ok(()),
        }
    }

    /// Runs progress and takes every CQE (incoming notifications, whose
    /// buffers go back to the pool); returns how many.
    ///
    /// # Errors
    /// The CQ is corrupt.
    pub fn service(&mut self) -> Result<usize, BenchError> {
        let mut total = if self.core_thread {
            0
        } else {
            self.worker.progress()
        };
        loop {
            let n = self
                .qp
                .reap(&mut self.cqes)
                .map_err(|e| BenchError::Target(format!("target CQ: {e}")))?;
            if n == 0 {
                return Ok(total);
            }
            for cqe in &self.cqes[..n] {
                drop(self.qp.notification(cqe));
            }
            total += n;
        }
    }
}

/// The target as the initiator's bench loop sees it.
pub trait Target {
    /// Before a row (only with `--check-consistency`).
    ///
    /// # Errors
    /// As [`TargetState::prepare`], or the child failed.
    fn prepare(&mut self, spec: RowSpec) -> Result<(), BenchError>;
    /// After a row (only with `--check-consistency`).
    ///
    /// # Errors
    /// As [`TargetState::verify`], or the child failed.
    fn verify(&mut self, spec: RowSpec) -> Result<(), BenchError>;
    /// Between batches, outside the timed part: lets an in-process target
    /// take its notifications (a child does it by itself).
    ///
    /// # Errors
    /// The target's CQ is corrupt.
    fn service(&mut self) -> Result<(), BenchError>;
}

/// A target worker in this process (loopback).
#[derive(Debug)]
pub struct LocalTarget(pub TargetState);

impl Target for LocalTarget {
    fn prepare(&mut self, spec: RowSpec) -> Result<(), BenchError> {
        self.0.prepare(spec)
    }
    fn verify(&mut self, spec: RowSpec) -> Result<(), BenchError> {
        self.0.verify(spec)
    }
    fn service(&mut self) -> Result<(), BenchError> {
        self.0.service().map(drop)
    }
}

/// A target started by hand (`--role initiator`): nothing to ask of it.
#[derive(Debug)]
pub struct RemoteTarget;

impl Target for RemoteTarget {
    fn prepare(&mut self, _: RowSpec) -> Result<(), BenchError> {
        Ok(())
    }
    fn verify(&mut self, _: RowSpec) -> Result<(), BenchError> {
        Ok(())
    }
    fn service(&mut self) -> Result<(), BenchError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
