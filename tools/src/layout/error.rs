//! The error type of the layout audit.

use std::path::PathBuf;

/// Everything that can go wrong while reading an artifact, a baseline, or
/// writing a report. Each message is one line and names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The file could not be read (missing, unreadable, a directory).
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is neither an object file nor an archive of object files.
    #[error(
        "{}: not an object file, executable, shared library or archive ({source})",
        path.display()
    )]
    NotObject {
        /// The file.
        path: PathBuf,
        /// What the object parser said about the file magic.
        #[source]
        source: object::Error,
    },
    /// The file looks like an object file or archive but is malformed
    /// (truncated, corrupt headers).
    #[error(
        "{}{}: malformed object file: {}",
        path.display(),
        member_suffix(member),
        one_line(source)
    )]
    Object {
        /// The file.
        path: PathBuf,
        /// The archive member, when the file is an archive.
        member: Option<String>,
        /// The object parser's error.
        #[source]
        source: object::Error,
    },
    /// A compressed debug section claims more bytes than rflayout will
    /// inflate (a corrupt or hostile header; real sections are far
    /// smaller).
    #[error(
        "{}{}: section {section} claims {size} bytes uncompressed (at most {limit})",
        path.display(),
        member_suffix(member)
    )]
    SectionTooLarge {
        /// The file.
        path: PathBuf,
        /// The archive member, when the file is an archive.
        member: Option<String>,
        /// The section's name.
        section: &'static str,
        /// The uncompressed size its header claims.
        size: u64,
        /// The most rflayout inflates.
        limit: u64,
    },
    /// The file is an `ar` archive whose member headers or sizes are
    /// corrupt (for example a truncated `.rlib`).
    #[error("{}: malformed archive: {message}", path.display())]
    Archive {
        /// The file.
        path: PathBuf,
        /// What is wrong, on one line.
        message: String,
    },
    /// The DWARF debug info is malformed.
    #[error(
        "{}{}: malformed DWARF debug info: {}",
        path.display(),
        member_suffix(member),
        one_line(source)
    )]
    Dwarf {
        /// The file.
        path: PathBuf,
        /// The archive member, when the file is an archive.
        member: Option<String>,
        /// The DWARF parser's error.
        #[source]
        source: gimli::Error,
    },
    /// The file has no DWARF debug info that describes types (none at all,
    /// or line tables only).
    #[error(
        "{}: no DWARF debug info with types (stripped, or built with debug info off \
         or line tables only; split DWARF in .dwo/.dwp files is not supported)",
        path.display()
    )]
    NoDebugInfo {
        /// The file.
        path: PathBuf,
    },
    /// No type in the file matches the requested name or glob.
    #[error("{}: no type matches `{pattern}`{}", path.display(), near_suffix(near))]
    TypeNotFound {
        /// The file.
        path: PathBuf,
        /// The name or glob asked for.
        pattern: String,
        /// Names in the file that look close (may be empty).
        near: Vec<String>,
    },
    /// The baseline file is not valid TOML of the expected shape.
    #[error("{}: invalid baseline: {message}", path.display())]
    Baseline {
        /// The baseline file.
        path: PathBuf,
        /// What is wrong, on one line.
        message: String,
    },
    /// Writing the report failed (for example a closed pipe).
    #[error("cannot write output: {source}")]
    Output {
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A message with every run of whitespace (gimli wraps some of its
/// messages over several lines) collapsed to one space.
fn one_line(message: &impl std::fmt::Display) -> String {
    message
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn member_suffix(member: &Option<String>) -> String {
    member
        .as_ref()
        .map(|m| format!("({m})"))
        .unwrap_or_default()
}

fn near_suffix(near: &[String]) -> String {
    if near.is_empty() {
        String::new()
    } else {
        format!("; near matches: {}", near.join(", "))
    }
}

impl From<std::io::Error> for LayoutError {
    fn from(source: std::io::Error) -> Self {
        Self::Output { source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line_and_name_the_file() {
        let errors = [
            LayoutError::NoDebugInfo {
                path: "a/b.so".into(),
            },
            LayoutError::TypeNotFound {
                path: "x.rlib".into(),
                pattern: "*::Sqee".into(),
                near: vec!["ring::Sqe".into(), "ring::Cqe".into()],
            },
            LayoutError::Object {
                path: "lib.rlib".into(),
                member: Some("m.o".into()),
                source: object::File::parse(&b"\x7fELF"[..])
                    .expect_err("a 4-byte ELF is malformed"),
            },
        ];
        let wrapped = LayoutError::Dwarf {
            path: "x.o".into(),
            member: None,
            source: gimli::Error::AbbreviationTagZero,
        };
        assert_eq!(
            wrapped.to_string(),
            "x.o: malformed DWARF debug info: An abbreviation declared that its tag is zero, \
             but zero is reserved for null records"
        );
        for e in &errors {
            let text = e.to_string();
            assert!(!text.contains('\n'), "{text}");
        }
        assert!(errors[0].to_string().starts_with("a/b.so: "));
        assert_eq!(
            errors[1].to_string(),
            "x.rlib: no type matches `*::Sqee`; near matches: ring::Sqe, ring::Cqe"
        );
        assert!(
            errors[2]
                .to_string()
                .starts_with("lib.rlib(m.o): malformed")
        );
    }
}
