//! Generates `ringfence.h` (cbindgen over `src/`, then `src/inline.h`
//! appended) into `OUT_DIR`, writes `ringfence.pc` next to the library, and
//! restricts the shared library's exports to `rf_*` (`ringfence.map`).
//!
//! The committed `include/ringfence.h` must equal the generated header: the
//! unit test `committed_header_is_up_to_date` checks, and rewrites it when
//! `RINGFENCE_BLESS` is set.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    for input in ["src", "cbindgen.toml", "ringfence.map", "ringfence.pc.in"] {
        println!("cargo:rerun-if-changed={input}");
    }

    // The header.
    let mut config = cbindgen::Config::from_file(manifest.join("cbindgen.toml"))
        .expect("bindings/c/cbindgen.toml is valid");
    let inline = std::fs::read_to_string(manifest.join("src/inline.h")).expect("src/inline.h");
    config.trailer = Some(inline);
    cbindgen::Builder::new()
        .with_crate(&manifest)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate ringfence.h")
        .write_to_file(out.join("ringfence.h"));

    // Only `rf_*` leaves the shared library.
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        manifest.join("ringfence.map").display()
    );

    // pkg-config file beside the library: target/<profile>/ringfence.pc.
    if let Some(libdir) = profile_dir(&out) {
        let pc = std::fs::read_to_string(manifest.join("ringfence.pc.in"))
            .expect("ringfence.pc.in")
            .replace("@LIBDIR@", &libdir.display().to_string())
            .replace(
                "@INCLUDEDIR@",
                &manifest.join("include").display().to_string(),
            )
            .replace(
                "@VERSION@",
                &env::var("CARGO_PKG_VERSION").expect("set by cargo"),
            );
        std::fs::write(libdir.join("ringfence.pc"), pc).expect("writing ringfence.pc");
    }
}

/// `target/<profile>` (or `target/<triple>/<profile>`) from
/// `OUT_DIR = <that>/build/<package>-<hash>/out`.
fn profile_dir(out: &Path) -> Option<PathBuf> {
    let dir = out.ancestors().nth(3)?;
    (out.ancestors().nth(2)?.file_name()? == "build").then(|| dir.to_path_buf())
}
