//! A C struct and typedefs read from a `gcc -g -c` object (skipped with a
//! message where gcc is missing).

use crate::{field, fields, holes, show_one};
use std::process::Command;

#[test]
fn c_struct_from_gcc_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("rf_sample.c");
    let object = dir.path().join("rf_sample.o");
    std::fs::write(
        &source,
        "struct rf_sample { char a; long b; short c; };\n\
         typedef struct { unsigned int lo:3; unsigned int hi:5; int n; } rf_bits_t;\n\
         struct rf_sample rf_sample_instance;\n\
         rf_bits_t rf_bits_instance;\n",
    )
    .expect("write C source");
    let compiled = Command::new("gcc")
        .args(["-g", "-c"])
        .arg(&source)
        .arg("-o")
        .arg(&object)
        .output();
    match compiled {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!("gcc failed: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => {
            eprintln!("skipping c_struct_from_gcc_object: gcc not available ({e})");
            return;
        }
    }
    let sample = show_one(&object, "rf_sample");
    assert_eq!(sample["size"], 24);
    assert_eq!(sample["align"], 8);
    assert_eq!(
        fields(&sample),
        [
            field("a", 0, 1, "char"),
            field("b", 8, 8, "long int"),
            field("c", 16, 2, "short int")
        ]
    );
    assert_eq!(holes(&sample), [(1, 7)]);
    assert_eq!(sample["tail_padding"], 6);
    // The C keyword is accepted.
    assert_eq!(show_one(&object, "struct rf_sample"), sample);

    // A typedef of an anonymous struct, with bit-fields.
    let bits = show_one(&object, "rf_bits_t");
    assert_eq!(bits["size"], 8);
    let lo = &bits["fields"][0];
    assert_eq!(
        (
            lo["name"].as_str(),
            lo["offset"].as_u64(),
            lo["bit_offset"].as_u64(),
            lo["bit_size"].as_u64()
        ),
        (Some("lo"), Some(0), Some(0), Some(3))
    );
    let hi = &bits["fields"][1];
    assert_eq!(
        (
            hi["name"].as_str(),
            hi["offset"].as_u64(),
            hi["bit_offset"].as_u64(),
            hi["bit_size"].as_u64()
        ),
        (Some("hi"), Some(0), Some(3), Some(5))
    );
    assert_eq!(bits["fields"][2]["offset"], 4);
}
