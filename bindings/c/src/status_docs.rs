//! A check of the documented statuses against the code: for every exported
//! function, each status its body names (`Status::X`, or a helper that
//! returns known ones) must appear in its doc comment's `RF_E*` list.
//!
//! A text-level check, on the sources as compiled (`include_str!`). It sees
//! the statuses a function's own body can return, and those of the helpers
//! listed in `HELPERS`; statuses that come up from the Rust library through
//! `e.status()` are documented by hand.

/// The ffi sources.
const SOURCES: &[&str] = &[
    include_str!("ffi/mod.rs"),
    include_str!("ffi/worker.rs"),
    include_str!("ffi/mem.rs"),
    include_str!("ffi/ring.rs"),
];

/// Helpers a body calls, and the statuses each can return.
const HELPERS: &[(&str, &[&str])] = &[
    (
        "with_worker(",
        &["RF_ESTALE_HANDLE", "RF_EINVALID_ARGUMENT"],
    ),
    ("with_ring(", &["RF_ESTALE_HANDLE", "RF_EINVALID_ARGUMENT"]),
    ("check_out(", &["RF_EINVALID_ARGUMENT"]),
];

/// `InvalidArgument` -> `RF_EINVALID_ARGUMENT`.
fn c_name(variant: &str) -> String {
    let mut name = String::from("RF_E");
    for (i, c) in variant.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// Every exported function: its name, doc text and body.
fn functions(source: &str) -> Vec<(String, String, String)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line
            .strip_prefix("pub unsafe extern \"C\" fn ")
            .or_else(|| line.strip_prefix("pub extern \"C\" fn "))
        else {
            continue;
        };
        let name: String = rest.chars().take_while(|c| *c != '(').collect();
        let mut doc = Vec::new();
        for l in lines[..i].iter().rev() {
            if let Some(d) = l.strip_prefix("///") {
                doc.push(d);
            } else if !l.starts_with("#[") {
                break;
            }
        }
        let body: Vec<&str> = lines[i..]
            .iter()
            .take_while(|l| **l != "}")
            .copied()
            .collect();
        out.push((name, doc.join("\n"), body.join("\n")));
    }
    out
}

#[test]
fn every_status_a_function_returns_is_in_its_doc() {
    let mut missing = Vec::new();
    let mut seen = 0;
    for source in SOURCES {
        for (name, doc, body) in functions(source) {
            seen += 1;
            let mut returns: Vec<String> = Vec::new();
            for part in body.split("Status::").skip(1) {
                let variant: String = part.chars().take_while(|c| c.is_alphanumeric()).collect();
                // `Status::ALL` and other constants are not statuses.
                if variant.chars().any(char::is_lowercase) {
                    returns.push(c_name(&variant));
                }
            }
            for (helper, statuses) in HELPERS {
                if body.contains(helper) {
                    returns.extend(statuses.iter().map(|s| s.to_string()));
                }
            }
            for status in returns {
                if !doc.contains(&status) {
                    missing.push(format!("{name}: {status}"));
                }
            }
        }
    }
    missing.sort();
    missing.dedup();
    // And every status a doc names exists (a misspelt one documents
    // nothing).
    let known: Vec<&str> = crate::abi::STATUS_NAMES.iter().map(|(n, _)| *n).collect();
    for source in SOURCES {
        for (name, doc, _) in functions(source) {
            for part in doc.split("RF_E").skip(1) {
                let rest: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect();
                let status = format!("RF_E{rest}");
                if !rest.starts_with("P_")
                    && status != "RF_ELIBRARY_BASE"
                    && !known.contains(&status.as_str())
                {
                    missing.push(format!("{name}: names {status}, which is no status"));
                }
            }
        }
    }
    assert!(
        seen >= 25,
        "found only {seen} exported functions: did the layout change?"
    );
    assert!(
        missing.is_empty(),
        "statuses returned but not documented:\n{}",
        missing.join("\n")
    );
}
