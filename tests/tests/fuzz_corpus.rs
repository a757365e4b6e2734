//! The fuzz targets' checks (`fuzz/checks/`) on stable: every committed
//! seed, and every input the fuzzer kept under `fuzz/corpus-new/` or
//! reported under `fuzz/artifacts/` (when present), runs through the same
//! check its target runs; the committed seed corpus is exactly what
//! `checks::seeds` generates (`RINGFENCE_BLESS=1` rewrites it); and the
//! checks hold on cut and bit-flipped seeds, the inputs the fuzzer reaches
//! first.

#[allow(dead_code)]
#[path = "../../fuzz/checks/mod.rs"]
mod checks;

use ringfence_tests::corpus::Corpus;
use std::path::Path;

fn corpus() -> Corpus {
    Corpus {
        dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz"),
        targets: checks::TARGETS,
        seeds: checks::seeds(),
        bless: "RINGFENCE_BLESS=1 cargo test -p ringfence-tests --test fuzz_corpus",
    }
}

fn check_of(target: &str) -> checks::Check {
    corpus().check_of(target)
}

#[test]
fn the_committed_seeds_are_the_generated_ones() {
    corpus().assert_committed_seeds_are_generated();
}

#[test]
fn every_input_passes_its_target_check() {
    corpus().assert_every_input_passes();
}

#[test]
fn the_checks_hold_on_cut_and_flipped_seeds() {
    let mut ran = 0u32;
    for (target, _, bytes) in checks::seeds() {
        let check = check_of(target);
        // The engine's targets build workers per input: fewer variants.
        let (cuts, flips) = match target {
            "sqe_validate" | "rkey_unpack" | "address_decode" => (8, 24),
            _ => (48, 64),
        };
        let step = (bytes.len() / cuts).max(1);
        for end in (0..=bytes.len()).step_by(step) {
            check(&bytes[..end]);
            ran += 1;
        }
        for at in (0..bytes.len().min(flips * 4)).step_by(4).take(flips) {
            let mut b = bytes.clone();
            b[at] ^= 0x81;
            check(&b);
            ran += 1;
        }
    }
    assert!(ran > 1000, "{ran}");
}

fn seed(target: &str, name: &str) -> Vec<u8> {
    checks::seeds()
        .into_iter()
        .find(|(t, n, _)| *t == target && n == name)
        .map(|(_, _, b)| b)
        .unwrap_or_else(|| panic!("no seed {target}/{name}"))
}

#[test]
fn the_seeds_reach_the_paths_they_are_named_for() {
    use checks::ring::Reached;
    use ringfence_shm::fuzzing::ChannelOutcome;

    // SQEs: valid ones succeed, broken ones fail, one CQE each.
    let ok = |r: &[i32]| r.iter().all(|&r| r >= 0);
    let sqe = |name| checks::sqe::sqe_results(&seed("sqe_validate", name));
    for name in ["nop", "put", "put_next_poll", "get", "atomics", "notify"] {
        let r = sqe(name);
        assert!(!r.is_empty() && ok(&r), "{name}: {r:?}");
    }
    for name in [
        "put_past_window",
        "get_before_local",
        "put_wrong_key",
        "put_raw",
        "reserved",
        "unknown_opcode",
    ] {
        let r = sqe(name);
        assert!(r.len() == 1 && r[0] < 0, "{name}: {r:?}");
    }
    let r = sqe("skip_success");
    assert!(r.len() == 2 && r[0] == 0 && r[1] < 0, "{r:?}");
    let r = sqe("fence_flush_close");
    assert!(ok(&r[..6]) && r[6] < 0, "a PUT after CLOSE: {r:?}");

    // Keys: the real ones are taken and reach the window; damaged ones not.
    let rkey = |name| checks::rkey::rkey_outcome(&seed("rkey_unpack", name));
    assert_eq!(rkey("real"), (false, Some(3)));
    assert!(rkey("real_shm").0 && rkey("raw_shm").0);
    assert!(!rkey("shm_secret").0 || rkey("shm_secret").1.is_none());
    for name in ["empty", "part_length"] {
        assert_eq!(rkey(name).1, None, "{name}");
    }

    // Addresses: the real one connects, damaged ones do not.
    let connects = |name| checks::address::connects(&seed("address_decode", name));
    assert!(connects("real"));
    for name in [
        "empty",
        "magic_only",
        "long_name",
        "real_count",
        "real_part_len",
    ] {
        assert!(!connects(name), "{name}");
    }

    // Rings: canonical regions run, broken headers are refused.
    let ring = |name| checks::ring::ring_outcome(&seed("ring_attach", name));
    assert!(matches!(ring("canonical"), Reached::Ran(n) if n > 0));
    assert!(matches!(ring("canonical_one"), Reached::Ran(_)));
    assert!(matches!(ring("raw_header"), Reached::Ran(_)));
    assert_eq!(ring("claimed"), Reached::Attached);
    for name in [
        "bad_magic",
        "bad_version",
        "bad_entries",
        "bad_offset",
        "big_region_size",
        "raw_unsealed",
        "raw_zero",
    ] {
        assert_eq!(ring(name), Reached::Refused, "{name}");
    }

    // Connection pages: records are delivered, garbage is reported.
    let page = |name| checks::shm::shm_control_outcome(&seed("shm_control", name));
    for (name, want) in [("one", 1), ("several", 5), ("padded", 3), ("bigger", 12)] {
        match page(name) {
            ChannelOutcome::Drained {
                delivered,
                corrupt: false,
                ..
            } => {
                assert_eq!(delivered.len(), want, "{name}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(matches!(
        page("too_large"),
        ChannelOutcome::Drained { dropped: 1, .. }
    ));
    for name in ["bad_tail", "unknown_kind"] {
        assert!(
            matches!(page(name), ChannelOutcome::Drained { corrupt: true, .. }),
            "{name}"
        );
    }
    for name in ["raw", "bad_capacity"] {
        assert_eq!(page(name), ChannelOutcome::Refused, "{name}");
    }

    // Artifacts: the objects and the archive read, with their structs.
    let elf = |name| checks::elf::layouts(&seed("rflayout_elf", name));
    assert!(elf("c_object").unwrap().iter().any(|n| n == "header"));
    assert!(
        elf("rust_object")
            .unwrap()
            .iter()
            .any(|n| n.ends_with("Slot"))
    );
    let both = elf("archive").unwrap();
    assert!(both.iter().any(|n| n == "header") && both.iter().any(|n| n.ends_with("Slot")));
    for name in ["cut_object", "empty_archive", "archive_overlong_member"] {
        assert_eq!(elf(name), None, "{name}");
    }
}
