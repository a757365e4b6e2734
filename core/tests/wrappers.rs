//! Wrapper drivers forward every `Driver` method (STYLE.md §2: a
//! middleware driver that skips one silently changes behaviour, since the
//! trait's default then runs instead of the inner driver's).
//!
//! A text-level check, on the sources as compiled (`include_str!`): the
//! method names declared in `pub trait Driver` (the `fn name(` lines
//! inside it) must each be defined in every wrapper's `impl .. Driver for
//! ..` block. It reads names, not signatures: the compiler checks those.

/// The names of the `fn`s declared (or defined) directly in the block that
/// starts at the line beginning with `header`, up to its closing `}` at
/// the header's indentation.
fn fns_in_block(source: &str, header: &str) -> Vec<String> {
    let mut lines = source.lines().skip_while(|l| !l.starts_with(header));
    assert!(
        lines.next().is_some(),
        "no block starting with {header:?}: was it renamed?"
    );
    let mut names = Vec::new();
    for line in lines {
        if line.starts_with('}') {
            return names;
        }
        // Methods sit at one level of indentation: `    fn`, `    unsafe fn`.
        let Some(rest) = line.strip_prefix("    ") else {
            continue;
        };
        let rest = rest.strip_prefix("unsafe ").unwrap_or(rest);
        if let Some(signature) = rest.strip_prefix("fn ") {
            let name: String = signature
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            names.push(name);
        }
    }
    panic!("the block starting with {header:?} never closes");
}

const TRAIT: &str = include_str!("../src/driver/mod.rs");

/// Every wrapper driver of the crate: its source and its impl header.
const WRAPPERS: &[(&str, &str, &str)] = &[
    (
        "FaultInjector",
        include_str!("../../testkit/src/fault/seam.rs"),
        "impl<D: Driver> Driver for FaultInjector<D> {",
    ),
    (
        "SimDriver",
        include_str!("../../testkit/src/sim/seam.rs"),
        "impl<D: Driver> Driver for SimDriver<D> {",
    ),
];

#[test]
fn every_wrapper_driver_defines_every_driver_method() {
    let methods = fns_in_block(TRAIT, "pub trait Driver:");
    // The parse found the trait's methods, the optional ones included.
    for expected in [
        "name",
        "post",
        "flush",
        "commit",
        "poll",
        "wake_fds",
        "prepare_sleep",
        "woke",
        "connect",
        "quiesce",
        "direct",
        "alloc_memory",
        "lane_generation",
        "peer_limits",
        "release_rkey",
    ] {
        assert!(
            methods.iter().any(|m| m == expected),
            "`{expected}` not found in the trait: {methods:?}"
        );
    }
    for (wrapper, source, header) in WRAPPERS {
        let defined = fns_in_block(source, header);
        let missing: Vec<&String> = methods.iter().filter(|m| !defined.contains(m)).collect();
        assert!(
            missing.is_empty(),
            "{wrapper} does not forward {missing:?}: the trait's default would run instead of \
             the inner driver's"
        );
    }
}

#[test]
fn the_parse_sees_a_missing_method() {
    let source = "impl<D: Driver> Driver for Half<D> {\n    fn name(&self) {}\n    \
                  unsafe fn post(&mut self) {}\n        fn nested() {}\n}\n";
    let defined = fns_in_block(source, "impl<D: Driver> Driver for Half<D> {");
    assert_eq!(defined, ["name", "post"]);
}
