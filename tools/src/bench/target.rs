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

use crate::bench::cli::{Cli, OpKind};
use crate::bench::error::BenchError;
use crate::bench::latency::{Polling, Side, pong};
use ringfence::{Cqe, QueuePair, RegisteredBuf, Worker};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

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
    if s.len() % 2 != 0 {
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

/// How long a target in another process may take to answer a command
/// (only catches a hang).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// A target in another process that answers the command protocol (see
/// the module docs): a child process, or a `--listen` process.
pub trait Commands {
    /// The target's window.
    fn connection(&self) -> &Connection;

    /// Sends one command line.
    ///
    /// # Errors
    /// The link to the target is closed.
    fn send(&mut self, line: &str) -> Result<(), BenchError>;

    /// The next answer line.
    ///
    /// # Errors
    /// The target is gone, answered garbage, or did not answer within
    /// [`ANSWER_TIMEOUT`].
    fn answer(&mut self) -> Result<String, BenchError>;

    /// Waits for `ok` (or `done`); an `err` line becomes the error it names.
    ///
    /// # Errors
    /// The target's error, or it failed.
    fn expect_ok(&mut self) -> Result<(), BenchError> {
        let line = self.answer()?;
        match line.split_once(' ') {
            _ if line == "ok" || line == "done" => Ok(()),
            Some(("err-inconsistent", m)) => Err(BenchError::Inconsistent(m.to_string())),
            Some(("err", m)) => Err(BenchError::Target(m.to_string())),
            _ => Err(BenchError::Target(format!("unexpected answer `{line}`"))),
        }
    }

    /// Sends `WORD SPEC` and waits for `ok`.
    ///
    /// # Errors
    /// As [`expect_ok`](Commands::expect_ok).
    fn command(&mut self, word: &str, spec: RowSpec) -> Result<(), BenchError> {
        self.send(&format!("{word} {}", spec.to_words()))?;
        self.expect_ok()
    }
}

/// A target process spawned from this binary (`--role target --spawned`).
#[derive(Debug)]
pub struct ChildTarget {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<std::io::Result<String>>,
    /// The child's window.
    pub connection: Connection,
}

impl ChildTarget {
    /// Spawns the target for `cli`'s sweep and driver and reads its
    /// connection string.
    ///
    /// # Errors
    /// The child cannot be spawned, or exits or fails before printing it.
    pub fn spawn(cli: &Cli) -> Result<ChildTarget, BenchError> {
        let exe = std::env::current_exe().map_err(BenchError::io("finding rfbench's own path"))?;
        let mut cmd = Command::new(exe);
        cmd.args(["--role", "target", "--spawned"])
            .args(["--driver", cli.driver.name()])
            .arg("--op")
            .arg(match cli.op {
                OpKind::Write => "write",
                OpKind::Read => "read",
                OpKind::Atomic => "atomic",
            })
            .arg(format!("--start-block-size={}", cli.start_block_size))
            .arg(format!("--max-block-size={}", cli.max_block_size))
            .arg(format!("--start-batch-size={}", cli.start_batch_size))
            .arg(format!("--max-batch-size={}", cli.max_batch_size))
            .arg(format!("--lanes={}", cli.lanes))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if cli.corrupt_for_test {
            cmd.arg("--corrupt-for-test");
        }
        let mut child = cmd
            .spawn()
            .map_err(BenchError::io("spawning the target process"))?;
        let stdin = child.stdin.take();
        let stdout: ChildStdout = child
            .stdout
            .take()
            .ok_or_else(|| BenchError::Target("no pipe to the target's stdout".into()))?;
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name("rfbench-target-reader".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            })
            .map_err(BenchError::io("spawning a reader thread"))?;
        let mut target = ChildTarget {
            child,
            stdin,
            lines,
            connection: Connection {
                address: vec![],
                rkey: vec![],
                base: 0,
                len: 0,
            },
        };
        let first = target.answer()?;
        target.connection = Connection::decode(&first)
            .map_err(|_| BenchError::Target(format!("unexpected first line `{first}`")))?;
        Ok(target)
    }
}

impl Commands for ChildTarget {
    fn connection(&self) -> &Connection {
        &self.connection
    }

    fn send(&mut self, line: &str) -> Result<(), BenchError> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| BenchError::Target("its standard input is closed".into()))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| BenchError::Target(format!("writing to it: {e}")))
    }

    fn answer(&mut self) -> Result<String, BenchError> {
        match self.lines.recv_timeout(ANSWER_TIMEOUT) {
            Ok(Ok(line)) => Ok(line),
            Ok(Err(e)) => Err(BenchError::Target(format!("reading from it: {e}"))),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(BenchError::Hang(format!(
                "the target process did not answer within {ANSWER_TIMEOUT:?}"
            ))),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().ok();
                Err(BenchError::Target(format!(
                    "the target process exited ({}); see its messages above",
                    status.map_or("status unknown".into(), |s| s.to_string())
                )))
            }
        }
    }
}

/// A target in another process runs the checks when asked, and takes its
/// notifications by itself.
impl<T: Commands> Target for T {
    fn prepare(&mut self, spec: RowSpec) -> Result<(), BenchError> {
        self.command("prepare", spec)
    }
    fn verify(&mut self, spec: RowSpec) -> Result<(), BenchError> {
        self.command("verify", spec)
    }
    fn service(&mut self) -> Result<(), BenchError> {
        Ok(())
    }
}

impl Drop for ChildTarget {
    /// Closes the child's standard input (it exits), then reaps it; kills
    /// it if it does not exit within a second.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::yield_now();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--role target`: prints the connection string, then serves commands from
/// standard input (see the module docs) until it closes. With tcp the
/// worker's core thread runs throughout.
///
/// # Errors
/// The worker or window cannot be set up, or standard output fails.
pub fn serve(cli: &Cli, worker: Worker) -> Result<(), BenchError> {
    let mut state = TargetState::new(worker, cli.window_len(), cli.corrupt_for_test)?;
    if cli.driver.target_executes() {
        state.start_core_thread()?;
    }
    let conn = state.connection()?.encode();
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{conn}")
            .and_then(|()| out.flush())
            .map_err(BenchError::io("writing the connection string"))?;
    }
    if !cli.spawned {
        eprintln!(
            "rfbench target: {} B window; run `rfbench --driver {} --role initiator --peer {conn}` \
             (with the same or smaller sizes); serving until standard input closes",
            state.window.len(),
            cli.driver.name()
        );
    }
    let (tx, commands) = mpsc::channel::<String>();
    std::thread::Builder::new()
        .name("rfbench-commands".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        })
        .map_err(BenchError::io("spawning the command reader"))?;
    serve_commands(&mut state, &commands, &mut |line| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").and_then(|()| out.flush())
    })
}

/// Where a target writes its answer lines.
pub type AnswerSink<'a> = dyn FnMut(&str) -> std::io::Result<()> + 'a;

/// Serves the commands that arrive on `commands` (see the module docs),
/// writing each answer through `out`, until the channel's sender goes away.
/// Between commands it takes notifications ([`TargetState::service`]).
///
/// # Errors
/// The target's CQ is corrupt.
pub fn serve_commands(
    state: &mut TargetState,
    commands: &mpsc::Receiver<String>,
    out: &mut AnswerSink<'_>,
) -> Result<(), BenchError> {
    let mut idle = 0u32;
    loop {
        let work = state.service()?;
        let next = if work > 0 || idle < 64 {
            idle = if work > 0 { 0 } else { idle + 1 };
            commands.try_recv().map_err(|e| match e {
                mpsc::TryRecvError::Empty => mpsc::RecvTimeoutError::Timeout,
                mpsc::TryRecvError::Disconnected => mpsc::RecvTimeoutError::Disconnected,
            })
        } else {
            // Idle: leave the CPU to the initiator while waiting for a
            // command; notifications wait in the CQ meanwhile.
            commands.recv_timeout(Duration::from_micros(50))
        };
        match next {
            Ok(line) => {
                let answer = handle(state, &line, out);
                // A peer that went away is noticed by the channel.
                let _ = out(&answer);
                idle = 0;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            Err(mpsc::RecvTimeoutError::Timeout) => std::hint::spin_loop(),
        }
    }
}

/// One command; the answer line.
fn handle(state: &mut TargetState, line: &str, out: &mut AnswerSink<'_>) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let result = match words.split_first() {
        Some((&"prepare", rest)) => match RowSpec::from_words(rest) {
            Some(spec) => state.prepare(spec),
            None => Err(BenchError::Target(format!("malformed command `{line}`"))),
        },
        Some((&"verify", rest)) => match RowSpec::from_words(rest) {
            Some(spec) => state.verify(spec),
            None => Err(BenchError::Target(format!("malformed command `{line}`"))),
        },
        Some((&"pong", rest)) => return pong_command(state, rest, out),
        _ => Err(BenchError::Target(format!("unknown command `{line}`"))),
    };
    match result {
        Ok(()) => "ok".into(),
        Err(BenchError::Inconsistent(m)) => format!("err-inconsistent {m}"),
        Err(e) => format!("err {e}"),
    }
}

/// `pong CONNECTION WARMUP ITERS SIZE...`: connects back to the
/// initiator's window, answers `ok`, runs the ping-pong, and returns `done`.
///
/// This thread progresses the worker while it polls its window: with a
/// core thread (tcp), the core thread stops for the ping-pong and this
/// thread progresses at every spin, so that two threads, not three, spin
/// on the two sides together.
fn pong_command(state: &mut TargetState, words: &[&str], out: &mut AnswerSink<'_>) -> String {
    let core_thread = state.core_thread;
    let polling = if core_thread {
        Polling::Inline(1)
    } else {
        Polling::Inline(crate::bench::latency::SPINS_PER_POLL)
    };
    let mut run = |state: &mut TargetState| -> Result<(), BenchError> {
        let [conn, warmup, iters, sizes @ ..] = words else {
            return Err(BenchError::Target("malformed pong command".into()));
        };
        let conn = Connection::decode(conn)?;
        let num = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| BenchError::Target(format!("`{s}` is not a number")))
        };
        let (warmup, iters) = (num(warmup)?, num(iters)?);
        let rounds = warmup
            .checked_add(iters)
            .ok_or_else(|| BenchError::Target("too many ping-pong rounds".into()))?;
        let sizes = sizes
            .iter()
            .map(|s| num(s))
            .collect::<Result<Vec<_>, _>>()?;
        if sizes.iter().any(|&s| s < 8) {
            return Err(BenchError::Target(
                "ping-pong sizes must be at least 8 bytes".into(),
            ));
        }
        let max = sizes.iter().copied().max().unwrap_or(8);
        let mut side = Side::connect(&state.worker, &conn, state.window.clone(), max, polling)?;
        // The endpoint may still be connecting: the initiator progresses
        // its side only once it has this answer, and PUTs queue meanwhile.
        out("ok").map_err(BenchError::io("answering pong"))?;
        pong(&mut side, &sizes, rounds)?;
        Ok(())
    };
    if core_thread {
        state.worker.stop_core_thread();
    }
    let result = run(state);
    if core_thread {
        if let Err(e) = state.worker.start_core_thread(None) {
            return format!("err restarting the target's core thread: {e}");
        }
    }
    match result {
        Ok(()) => "done".into(),
        Err(e) => format!("err {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_round_trip_and_reject_garbage() {
        let c = Connection {
            address: vec![0, 1, 0xff],
            rkey: vec![9; 5],
            base: 0x7f00_1234_5000,
            len: 4096,
        };
        assert_eq!(Connection::decode(&c.encode()).unwrap(), c);
        for bad in [
            "",
            "rf1:",
            "rf2:00:00:0:1",
            "rf1:0g:00:0:1",
            "rf1:000:00:0:1",
        ] {
            assert!(Connection::decode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn row_specs_round_trip() {
        let s = RowSpec {
            op: OpKind::Atomic,
            block: 8,
            batch: 4,
            count: 1100,
        };
        let line = s.to_words();
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(RowSpec::from_words(&words), Some(s));
        // Commands may come over the network: nothing empty, nothing that
        // overflows on the way to the window check.
        for bad in [
            "write 0 1 1",
            "write 8 0 1",
            "write x 1 1",
            "fly 8 1 1",
            "write 8 1",
            "write 8 1 1 1",
        ] {
            let words: Vec<&str> = bad.split_whitespace().collect();
            assert_eq!(RowSpec::from_words(&words), None, "{bad}");
        }
        let huge = RowSpec {
            op: OpKind::Write,
            block: u64::MAX,
            batch: 2,
            count: 1,
        };
        assert_eq!(huge.span(), usize::MAX);
        let words = RowSpec {
            op: OpKind::Atomic,
            block: 1,
            batch: 1000,
            count: 1,
        };
        assert_eq!(words.checked_span(), 8000);
    }

    #[test]
    fn patterns_differ_between_rows_and_compare_finds_the_byte() {
        let a = RowSpec {
            op: OpKind::Write,
            block: 64,
            batch: 2,
            count: 1,
        };
        let b = RowSpec { block: 128, ..a };
        assert_ne!(pattern(a, 128), pattern(b, 128));
        let mut got = pattern(a, 128);
        compare(a, &got, "x").unwrap();
        got[70] ^= 1;
        let e = compare(a, &got, "x").unwrap_err().to_string();
        assert!(e.contains("byte 70 (transfer 1, byte 6"), "{e}");
    }
}
