//! `rfbench`: the nixlbench-style benchmark of ringfence. See
//! `tools/README.md` and `rfbench --help`.

use clap::Parser;
use ringfence_tools::bench::{self, Cli};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match bench::run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`rfbench | head`): not an error.
        Err(bench::BenchError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            let mut message = format!("rfbench: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                message += &format!(": {s}");
                source = s.source();
            }
            eprintln!("{message}");
            ExitCode::from(e.exit_code())
        }
    }
}
