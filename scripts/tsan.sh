#!/usr/bin/env bash
# ThreadSanitizer over the tests that run threads against each other: the
# ring (SPSC rings and doorbells across threads), the engine (the core
# thread, wake-ups, progress from several threads, the loopback driver's
# cross-thread accesses) and the shm driver (its control thread against
# `poll`, in one process). scripts/test.sh runs it as its `tsan` step.
#
#   ./scripts/tsan.sh
#
# Nightly only: `-Zsanitizer=thread` with the standard library rebuilt
# instrumented (`-Zbuild-std`, which needs the rust-src component; installed
# here when rustup can). Builds into target/tsan. Without nightly or
# rust-src it says why and exits 77 (skipped).
#
# Left out, and why:
# - loom models (ring/tests/loom*.rs): loom replaces the atomics and
#   threads with its own, nothing for TSan to see; they run in the loom step.
# - the engine's single-threaded suites (core/tests/fence/, mixed.rs,
#   async_seam/, fault_injector.rs, bounded_round.rs, wrappers.rs):
#   property tests of the fence engine driven from one thread (fence/
#   spawns one only to catch a panic, in reentry.rs), minutes under TSan for
#   nothing to see.
# - the cross-process tests (tests/tests/*): what they share crosses
#   processes, through shared memory TSan does not track between them; their
#   threads within each process are the shm driver's control thread and
#   the core thread, which the engine and shm tests above cover. They do
#   pass under TSan (`shm_notify` and `shm_rma`, run by hand: the children
#   are re-executed test binaries, instrumented too), but building the
#   tests crate instrumented costs about two more minutes of CI.
#
# Reports fail the run (halt_on_error). scripts/tsan.supp holds the
# suppressions, each with its reason; it is empty unless a report is
# understood to be a false positive.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "tsan: SKIPPED: no nightly toolchain (rustup toolchain install nightly --component rust-src)" >&2
  exit 77
fi
has_src() { rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; }
if command -v rustup >/dev/null 2>&1 && ! has_src; then
  timeout 600 rustup component add rust-src --toolchain nightly >/dev/null 2>&1 || true
fi
if ! has_src; then
  echo "tsan: SKIPPED: the nightly toolchain has no rust-src component, which -Zbuild-std needs (rustup component add rust-src --toolchain nightly)" >&2
  exit 77
fi

host=$(rustc +nightly -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="$root/target/tsan"
export RUSTFLAGS="-Zsanitizer=thread"
export RUSTDOCFLAGS="-Zsanitizer=thread"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/scripts/tsan.supp ${TSAN_OPTIONS:-}"
# The property tests that take part run fewer cases (TSan is 5-15x slower).
export PROPTEST_CASES="${PROPTEST_CASES:-16}"
tsan_test() {
  echo "== tsan: cargo test $*"
  cargo +nightly test -Zbuild-std --target "$host" --locked "$@"
}

start=$SECONDS
tsan_test -p ringfence-ring --lib
tsan_test -p ringfence --lib --test wake --test loopback --test bounded_wait --test exactly_once
tsan_test -p ringfence-shm --lib --test one_process
echo "tsan: no reports ($((SECONDS - start)) s)"
