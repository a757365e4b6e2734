//! The `rflayout` command line.
//!
//! ```text
//! rflayout show FILE TYPE... [--json] [--cache-line N]
//! rflayout check FILE --baseline layout.toml [--cache-line N]
//! rflayout baseline FILE TYPE... > layout.toml
//! ```
//!
//! Exit status: 0 success, 1 `check` found a type over budget or missing,
//! 2 bad usage or unreadable input (a missing or non-object file, no debug
//! info, a type that is not found, an invalid baseline).

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::artifact::Binary;
use super::baseline::Baseline;
use super::error::LayoutError;
use super::model::TypeLayout;
use super::pattern::TypePattern;
use super::report::{render_json, render_text};

/// Struct size and layout audit from DWARF debug info.
///
/// Reads an ELF executable, shared object, `.o`, or `.rlib`/`.a` archive
/// built with debug info, and prints the size, alignment, fields, holes,
/// tail padding and cache-line boundaries of the named types.
#[derive(Debug, Parser)]
#[command(name = "rflayout", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The `rflayout` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the layout of types.
    ///
    /// TYPE is a full name (`ringfence_ring::sqe::Sqe`,
    /// `alloc::vec::Vec<u8, alloc::alloc::Global>`), a C name (`rf_sample`),
    /// or a glob with `*` and `?` (`*::Sqe`, `ringfence_ring::*`).
    Show {
        /// The built artifact.
        file: PathBuf,
        /// Type names or globs.
        #[arg(required = true)]
        types: Vec<String>,
        /// Print one JSON array with an object per type instead of text.
        #[arg(long)]
        json: bool,
        /// Cache-line size in bytes for the boundary markers.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
        cache_line: u64,
    },
    /// Check types against a baseline of size and hole budgets; exit 1 if
    /// any type grew past its budget, has too many holes, or is missing.
    Check {
        /// The built artifact.
        file: PathBuf,
        /// The baseline TOML file.
        #[arg(long)]
        baseline: PathBuf,
        /// Cache-line size in bytes for the layouts of failing types.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
        cache_line: u64,
    },
    /// Print a baseline TOML with the current sizes and hole counts of
    /// types (globs expand to every matching type).
    Baseline {
        /// The built artifact.
        file: PathBuf,
        /// Type names or globs.
        #[arg(required = true)]
        types: Vec<String>,
    },
}

/// How a successful run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything asked for was done (and every budget held).
    Success,
    /// `check` found a type over budget or missing.
    CheckFailed,
}

impl Outcome {
    /// The process exit status: 0 or 1.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::CheckFailed => 1,
        }
    }
}

/// The exit status for an error: usage and input errors are 2.
pub const ERROR_EXIT_CODE: u8 = 2;

/// Runs a parsed command line, writing the report to `out`.
///
/// # Errors
///
/// Any [`LayoutError`]: the caller prints it on one line and exits with
/// [`ERROR_EXIT_CODE`].
pub fn run(cli: &Cli, out: &mut dyn Write) -> Result<Outcome, LayoutError> {
    match &cli.command {
        Command::Show {
            file,
            types,
            json,
            cache_line,
        } => {
            let binary = Binary::open(file)?;
            let layouts = find_all(&binary, types)?;
            if *json {
                writeln!(out, "{}", render_json(&layouts))?;
            } else {
                for (i, layout) in layouts.iter().enumerate() {
                    if i > 0 {
                        writeln!(out)?;
                    }
                    write!(out, "{}", render_text(layout, *cache_line))?;
                }
            }
            Ok(Outcome::Success)
        }
        Command::Check {
            file,
            baseline,
            cache_line,
        } => {
            let baseline = Baseline::load(baseline)?;
            let binary = Binary::open(file)?;
            let report = baseline.check(&binary);
            write!(out, "{}", report.render(*cache_line))?;
            Ok(if report.passed() {
                Outcome::Success
            } else {
                Outcome::CheckFailed
            })
        }
        Command::Baseline { file, types } => {
            let binary = Binary::open(file)?;
            let layouts = find_all(&binary, types)?;
            write!(out, "{}", Baseline::from_layouts(&layouts).to_toml())?;
            Ok(Outcome::Success)
        }
    }
}

/// The layouts of every pattern, in the order asked, each type once.
fn find_all(binary: &Binary, patterns: &[String]) -> Result<Vec<TypeLayout>, LayoutError> {
    let mut all: Vec<TypeLayout> = Vec::new();
    for pattern in patterns {
        for layout in binary.find_required(&TypePattern::new(pattern))? {
            if !all.contains(&layout) {
                all.push(layout);
            }
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_the_three_subcommands() {
        let cli = Cli::try_parse_from(["rflayout", "show", "a.rlib", "*::Sqe", "x::Y", "--json"])
            .expect("show");
        match cli.command {
            Command::Show {
                types,
                json,
                cache_line,
                ..
            } => {
                assert_eq!(types, ["*::Sqe", "x::Y"]);
                assert!(json);
                assert_eq!(cache_line, 64);
            }
            other => panic!("parsed as {other:?}"),
        }
        let cli = Cli::try_parse_from(["rflayout", "check", "a.rlib", "--baseline", "l.toml"])
            .expect("check");
        assert!(matches!(cli.command, Command::Check { .. }));
        let cli = Cli::try_parse_from(["rflayout", "baseline", "a.rlib", "T"]).expect("baseline");
        assert!(matches!(cli.command, Command::Baseline { .. }));
    }

    #[test]
    fn rejects_bad_usage() {
        for args in [
            &["rflayout", "show", "a.rlib"][..],
            &["rflayout", "show", "a.rlib", "T", "--cache-line", "0"],
            &["rflayout", "check", "a.rlib"],
            &["rflayout", "baseline", "a.rlib"],
            &["rflayout", "frobnicate"],
        ] {
            let err = Cli::try_parse_from(args).expect_err("bad usage");
            assert_eq!(err.exit_code(), i32::from(ERROR_EXIT_CODE), "{args:?}");
        }
    }

    #[test]
    fn missing_file_is_an_error_not_a_panic() {
        let cli =
            Cli::try_parse_from(["rflayout", "show", "/nonexistent/x.rlib", "T"]).expect("parse");
        let mut out = Vec::new();
        let err = run(&cli, &mut out).expect_err("missing");
        assert!(
            err.to_string()
                .starts_with("/nonexistent/x.rlib: cannot read")
        );
        assert!(out.is_empty());
    }
}
