//! The target's pattern checks and command handling.

use super::*;

#[test]
fn connection_strings_round_trip_and_reject_garbage() {
    let c = Connection {
        address: vec![0, 1, 0xff],
        rkey: vec![9; 5],
        base: 0x7f00_1234_5000,
        len: 4096,
    };
    assert_eq!(Connection::decode(&c.encode()).unwrap(), c);
    for bad in [
        "",
        "rf1:",
        "rf2:00:00:0:1",
        "rf1:0g:00:0:1",
        "rf1:000:00:0:1",
    ] {
        assert!(Connection::decode(bad).is_err(), "{bad}");
    }
}

#[test]
fn row_specs_round_trip() {
    let s = RowSpec {
        op: OpKind::Atomic,
        block: 8,
        batch: 4,
        count: 1100,
    };
    let line = s.to_words();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(RowSpec::from_words(&words), Some(s));
    // Commands may come over the network: nothing empty, nothing that
    // overflows on the way to the window check.
    for bad in [
        "write 0 1 1",
        "write 8 0 1",
        "write x 1 1",
        "fly 8 1 1",
        "write 8 1",
        "write 8 1 1 1",
    ] {
        let words: Vec<&str> = bad.split_whitespace().collect();
        assert_eq!(RowSpec::from_words(&words), None, "{bad}");
    }
    let huge = RowSpec {
        op: OpKind::Write,
        block: u64::MAX,
        batch: 2,
        count: 1,
    };
    assert_eq!(huge.span(), usize::MAX);
    let words = RowSpec {
        op: OpKind::Atomic,
        block: 1,
        batch: 1000,
        count: 1,
    };
    assert_eq!(words.checked_span(), 8000);
}

#[test]
fn patterns_differ_between_rows_and_compare_finds_the_byte() {
    let a = RowSpec {
        op: OpKind::Write,
        block: 64,
        batch: 2,
        count: 1,
    };
    let b = RowSpec { block: 128, ..a };
    assert_ne!(pattern(a, 128), pattern(b, 128));
    let mut got = pattern(a, 128);
    compare(a, &got, "x").unwrap();
    got[70] ^= 1;
    let e = compare(a, &got, "x").unwrap_err().to_string();
    assert!(e.contains("byte 70 (transfer 1, byte 6"), "{e}");
}
