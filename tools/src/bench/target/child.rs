//! A target in another process: the command protocol's client side, and
//! the child process that runs one.

use crate::bench::cli::{Cli, OpKind};
use crate::bench::error::BenchError;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::*;

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
