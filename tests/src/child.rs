//! Running one role of the current test binary in a child process.
//!
//! The parent re-executes its own test binary with the name of the running
//! test and an environment variable naming the role; the test function checks
//! [`role`] first and runs the child's part when it is set. The child's end of
//! a socket pair becomes its standard input, so descriptors can be passed
//! with `SCM_RIGHTS` without leaking the socket into any other process.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};

/// The environment variable that carries the role to a child.
pub const ROLE_ENV: &str = "RINGFENCE_TEST_CHILD_ROLE";

/// The role this process was started for, if it is a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// A spawned child and the parent's end of its socket.
#[derive(Debug)]
pub struct ChildProcess {
    /// The process; killed on drop if still running.
    pub process: Child,
    /// The parent's end of the socket pair.
    pub socket: UnixStream,
}

impl ChildProcess {
    /// Runs `test` (the full name of the calling test, e.g.
    /// `module::test_fn`) of this binary in a child with `role`.
    ///
    /// # Panics
    /// If the socket pair or the process cannot be created.
    pub fn spawn(test: &str, role: &str) -> ChildProcess {
        let (parent, child) = UnixStream::pair().expect("socketpair");
        let exe = std::env::current_exe().expect("current_exe");
        let process = Command::new(exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, role)
            .stdin(Stdio::from(OwnedFd::from(child)))
            // The child's test harness chatter would read as the parent's; its
            // panics and diagnostics go to stderr, which is kept.
            .stdout(Stdio::null())
            .spawn()
            .expect("spawning the child test process");
        ChildProcess {
            process,
            socket: parent,
        }
    }

    /// Waits for the child and asserts that it exited with status 0.
    ///
    /// # Panics
    /// If the child failed.
    pub fn join(mut self) {
        let status = self.process.wait().expect("waiting for the child");
        assert!(status.success(), "child process failed: {status}");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.process.try_wait() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// In a child: the socket to the parent (the child's standard input).
///
/// # Panics
/// If standard input cannot be duplicated.
pub fn parent_socket() -> UnixStream {
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .expect("dup(stdin)");
    UnixStream::from(fd)
}
