//! What the `rfbench` test binaries share: starting a `--listen` target
//! and waiting for it to exit.

// Each test binary includes this module and uses a different part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Only catches a hang.
pub const HANG: Duration = Duration::from_secs(120);

/// Removes every `RINGFENCE_*` variable: only the arguments steer a run.
pub fn clean(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("RINGFENCE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Starts `cmd` (an `rfbench --driver tcp --listen IP:0 ...`, prepared by
/// the caller) and reads the address its first line of standard output
/// names.
pub fn listening(cmd: &mut Command) -> (Child, String) {
    let mut child = clean(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("rfbench: listening on ")
        .unwrap_or_else(|| panic!("first line `{first}`"))
        .to_string();
    (child, addr)
}

/// Waits for a `--listen` target to exit (a hang is killed and fails the
/// test); its status and standard error.
pub fn finish(mut child: Child) -> (ExitStatus, String) {
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        let _ = tx.send(err);
    });
    // Standard error closes when the process exits.
    let err = match rx.recv_timeout(HANG) {
        Ok(err) => err,
        Err(_) => {
            let _ = child.kill();
            panic!("the --listen target did not exit");
        }
    };
    (child.wait().unwrap(), err)
}
