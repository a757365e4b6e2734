//! `rflayout`: struct size and layout audit from DWARF debug info.
//!
//! See [`ringfence_tools::layout::cli`] for the command line and
//! `tools/README.md` for the baseline format. Exit status: 0 success, 1 a
//! `check` failed, 2 usage or input error.
#![deny(unsafe_code, missing_docs, missing_debug_implementations)]

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use ringfence_tools::layout::cli::{Cli, ERROR_EXIT_CODE, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = run(&cli, &mut out).and_then(|outcome| {
        out.flush()?;
        Ok(outcome)
    });
    match result {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(error) => {
            eprintln!("rflayout: {error}");
            ExitCode::from(ERROR_EXIT_CODE)
        }
    }
}
