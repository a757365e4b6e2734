#!/usr/bin/env bash
# Runs every ringfence test: format, lints, unit and integration tests (two
# real processes included), doc tests, a bench smoke run, docs, loom models,
# miri, the struct layout audit, the fuzz targets for a bounded time, and
# ThreadSanitizer over the threaded tests, and the Python package's tests.
# Installs what is missing first.
#
#   ./scripts/test.sh              everything (what CI runs)
#   ./scripts/test.sh quick        format, clippy and tests only
#   ./scripts/test.sh STEP...      those steps, in the order given
#   ./scripts/test.sh --list       the steps' names, in the order of a full run
#   RINGFENCE_SKIP_MIRI=1 ...      skip the miri step (it needs a nightly toolchain)
#   RINGFENCE_FUZZ_SECONDS=N ...   run each fuzz target N s (default 20; 0 skips the step)
#   RINGFENCE_SKIP_TSAN=1 ...      skip the ThreadSanitizer step
#
# The fuzz step (scripts/fuzz.sh: every cargo-fuzz target of fuzz/ and
# drivers/tcp/fuzz/, libFuzzer with AddressSanitizer, printing each target's
# executions and coverage, failing on a crash) and the tsan step
# (scripts/tsan.sh: -Zsanitizer=thread with -Zbuild-std, into target/tsan)
# need a nightly toolchain; without one (or without cargo-fuzz or rust-src,
# which they try to install) they print SKIPPED with the reason and the
# run goes on. Their seeds and checks also run on stable, in the tests step
# (tests/tests/fuzz_corpus.rs, drivers/tcp/tests/corpus.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

# Every step, in the order of a full run; `quick` is the first three.
all_steps=(format clippy tests bench-smoke c-tests python docs loom loom-sleep miri rflayout fuzz tsan)
quick_steps=(format clippy tests)
case "${1:-}" in
  --list) printf '%s\n' "${all_steps[@]}"; exit 0 ;;
  quick) steps=("${quick_steps[@]}") ;;
  "") steps=("${all_steps[@]}") ;;
  *)
    steps=("$@")
    for step in "${steps[@]}"; do
      if [[ " ${all_steps[*]} " != *" $step "* ]]; then
        echo "unknown step: $step (steps: quick ${all_steps[*]})" >&2
        exit 2
      fi
    done
    ;;
esac

log_dir=target/test-logs
mkdir -p "$log_dir"
# Counted at the end, from this run's logs only.
rm -f "$log_dir/cargo-test.log" "$log_dir/c-tests.log" "$log_dir/python-tests.log"
passed_steps=() skipped_steps=()

say() { printf '\n== %s\n' "$*"; }

# ---------------------------------------------------------------- installs
apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing system packages: $*"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
  else
    echo "missing system packages: $*" >&2
    echo "install them (Debian/Ubuntu: sudo apt-get install $*) and run this again" >&2
    exit 1
  fi
}

missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
# The C ABI's tests: a C++ compile check of ringfence.h (gcc brings the
# sanitizer runtimes, libasan and libubsan, with it).
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v strip >/dev/null 2>&1 || missing+=(binutils)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
# ringfence-bootstrap: etcd-client's build compiles etcd's protocol with
# protoc and the well-known types; the mpi crate's build runs bindgen
# (libclang) over Open MPI's headers; the tests run a real etcd server and
# Open MPI's mpirun.
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
[ -e /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || missing+=(libopenmpi-dev)
compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null || missing+=(libclang-dev)
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (https://rustup.rs), stable 1.88 or newer" >&2
  exit 1
fi
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$component"
  fi
done

# ---------------------------------------------------------------- steps
run_step() { # name command...
  local name=$1; shift
  say "$name: $*"
  "$@"
  passed_steps+=("$name")
}

# The workspace, and the Python package's crate (outside the workspace).
step_format() {
  run_step format cargo fmt --all -- --check
  run_step format-python cargo fmt --manifest-path bindings/python/Cargo.toml -- --check
}
step_clippy() { run_step clippy cargo clippy --workspace --all-targets --locked -- -D warnings; }

# Unit, integration and doc tests; the output is kept to count the tests.
step_tests() {
  # The bootstrap tests start an etcd server of their own on loopback
  # (and it ends with them), unless RINGFENCE_TEST_ETCD names one.
  say "tests: cargo test --workspace"
  cargo test --workspace --locked 2>&1 | tee "$log_dir/cargo-test.log"
  passed_steps+=(tests)
}


# Each criterion bench once, untimed: proves the benches build and their
# correctness checks pass. Timings come from `cargo bench` (benches/README.md).
step_bench-smoke() { run_step bench-smoke cargo test -p ringfence-benches --benches --locked; }

# The C ABI: libringfence's exports and pkg-config file, the C tests under
# AddressSanitizer and UndefinedBehaviorSanitizer (two processes over shm
# included), a C++17 compile of ringfence.h, and the examples. Its test
# cases are counted with the others.
step_c-tests() {
  say "c-tests: bindings/c/tests/run.sh"
  bindings/c/tests/run.sh 2>&1 | tee "$log_dir/c-tests.log"
  passed_steps+=(c-tests)
}

# The Python package (bindings/python, outside the Cargo workspace): a
# virtual environment in target/python-venv with the pinned build and test
# requirements (bindings/python/requirements.txt), the crate's clippy, its
# abi3 wheel built by maturin (release) and installed, and pytest over
# bindings/python/tests. pytest finding no test (exit 5) fails the step.
# Its passed and skipped counts join the summary.
python_ok() {
  command -v python3 >/dev/null 2>&1 &&
    python3 -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}
step_python() {
  say "python: bindings/python (venv, maturin, pytest)"
  python_ok || apt_install python3 python3-venv python3-dev
  if ! python_ok; then
    echo "python: needs CPython 3.11 or newer with venv and ensurepip (python3, python3-venv)" >&2
    exit 1
  fi
  local venv=$PWD/target/python-venv wheels=$PWD/target/python-wheels
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r bindings/python/requirements.txt
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
  run_step clippy-python cargo clippy --manifest-path bindings/python/Cargo.toml --all-targets \
    --locked -- -D warnings
  rm -rf "$wheels"
  "$venv/bin/maturin" build --release --locked -q -m bindings/python/Cargo.toml \
    -i "$venv/bin/python" -o "$wheels"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
    "$wheels"/ringfence-*.whl
  local rc=0
  (cd bindings/python && "$venv/bin/python" -m pytest -p no:cacheprovider --durations=5) 2>&1 \
    | tee "$log_dir/python-tests.log" || rc=$?
  if [ "$rc" = 5 ]; then
    echo "python: pytest collected no tests" >&2
    exit 1
  elif [ "$rc" != 0 ]; then
    exit "$rc"
  fi
  # The WRITE bench, briefly and without NIXL: it keeps working, and its
  # target and initiator agree on the notification count.
  run_step python-bench "$venv/bin/python" bindings/python/bench/write_bench.py \
    --sizes 4K,1M --iters 20 --rounds 1 --nixl off
  passed_steps+=(python)
}

step_docs() { RUSTDOCFLAGS="-D warnings" run_step docs cargo doc --workspace --no-deps --locked; }

# Loom models of the ring protocol, in their own target dir so the cfg
# change does not throw away the main build.
step_loom() {
  CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 \
    run_step loom cargo test -p ringfence-ring --release --test loom --locked
}
# Loom models of the core thread's sleep (SQ NEED_WAKEUP, a notification
# flag and a driver's wake descriptor against `ringfence_ring::sleep`), in
# the same loom target dir.
step_loom-sleep() {
  CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 \
    run_step loom-sleep cargo test -p ringfence-ring --release --test loom_sleep --locked
}

# Miri over the ring's unsafe code (regions and doorbells need system calls
# miri does not model; those tests say so and are skipped under miri).
have_miri() { cargo +nightly miri --version >/dev/null 2>&1; }
step_miri() {
if [ "${RINGFENCE_SKIP_MIRI:-0}" = 1 ]; then
  echo "miri: skipped (RINGFENCE_SKIP_MIRI=1)"; skipped_steps+=(miri)
else
  if ! have_miri && command -v rustup >/dev/null 2>&1; then
    timeout 600 rustup toolchain install nightly --profile minimal --component miri,rust-src >/dev/null 2>&1 \
      || timeout 600 rustup component add miri rust-src --toolchain nightly >/dev/null 2>&1 || true
  fi
  if have_miri; then
    MIRIFLAGS="-Zmiri-strict-provenance -Zmiri-symbolic-alignment-check" \
      run_step miri cargo +nightly miri test -p ringfence-ring --lib
    # The engine's unit tests too (memory copies and atomics on registered
    # memory, notification buffers, the request pool). Permissive
    # provenance: RMA addresses arrive as integers in SQEs, by design.
    MIRIFLAGS="-Zmiri-permissive-provenance -Zmiri-symbolic-alignment-check" \
      run_step miri-core cargo +nightly miri test -p ringfence --lib -- --skip sys::peer::tests
    # The copy primitive for memory a peer writes (`ringfence::peer_mem`,
    # which the shm and tcp drivers copy through: every size and alignment,
    # and racing threads, where a plain access where an atomic one is
    # promised is a data race Miri reports), once, under strict provenance
    # (miri-core above skips it). The rest of the shm driver's unsafe code
    # maps memfds and calls the kernel, which Miri does not model.
    MIRIFLAGS="-Zmiri-strict-provenance -Zmiri-symbolic-alignment-check" \
      run_step miri-peer cargo +nightly miri test -p ringfence --lib sys::peer::tests
  else
    echo "miri: SKIPPED, no nightly toolchain with miri could be had (rustup toolchain install nightly --component miri,rust-src)"
    skipped_steps+=(miri)
  fi
fi
}

# The struct layout audit against the committed baselines: the ring ABI
# types from the ring's rlib, the engine's hot structs from the core's.
step_rflayout() {
  cargo build -p ringfence-ring -p ringfence --locked
  run_step rflayout-ring cargo run -q -p ringfence-tools --bin rflayout --locked -- \
    check target/debug/libringfence_ring.rlib --baseline tools/layout.toml
  run_step rflayout-core cargo run -q -p ringfence-tools --bin rflayout --locked -- \
    check target/debug/libringfence.rlib --baseline tools/layout-core.toml
}

# Every fuzz target for a bounded time (scripts/fuzz.sh; 77: skipped).
step_fuzz() {
fuzz_seconds=${RINGFENCE_FUZZ_SECONDS:-20}
if [ "$fuzz_seconds" = 0 ]; then
  echo "fuzz: skipped (RINGFENCE_FUZZ_SECONDS=0)"; skipped_steps+=(fuzz)
else
  say "fuzz: scripts/fuzz.sh $fuzz_seconds"
  rc=0
  scripts/fuzz.sh "$fuzz_seconds" || rc=$?
  case $rc in
    0) passed_steps+=(fuzz) ;;
    77) skipped_steps+=(fuzz) ;;
    *) exit "$rc" ;;
  esac
fi
}

# ThreadSanitizer over the ring, engine and shm tests that use threads
# (scripts/tsan.sh; 77: skipped).
step_tsan() {
if [ "${RINGFENCE_SKIP_TSAN:-0}" = 1 ]; then
  echo "tsan: skipped (RINGFENCE_SKIP_TSAN=1)"; skipped_steps+=(tsan)
else
  say "tsan: scripts/tsan.sh"
  rc=0
  scripts/tsan.sh || rc=$?
  case $rc in
    0) passed_steps+=(tsan) ;;
    77) skipped_steps+=(tsan) ;;
    *) exit "$rc" ;;
  esac
fi
}

for step in "${steps[@]}"; do
  "step_$step"
done

# ---------------------------------------------------------------- summary
logs=()
for log in "$log_dir/cargo-test.log" "$log_dir/c-tests.log"; do
  [ -f "$log" ] && logs+=("$log")
done
passed=0 ignored=0
if [ ${#logs[@]} -gt 0 ]; then
  passed=$(grep -hEo 'test result: ok\. [0-9]+ passed' "${logs[@]}" | awk '{s += $4} END {print s + 0}')
fi
if [ -f "$log_dir/cargo-test.log" ]; then
  ignored=$(grep -Eo '[0-9]+ ignored' "$log_dir/cargo-test.log" | awk '{s += $1} END {print s + 0}')
fi
# pytest's closing line: "== 41 passed, 2 skipped in 3.1s ==".
if [ -f "$log_dir/python-tests.log" ]; then
  pytest_count() { # word: the count before it on pytest's last closing line
    awk -v word="$1" '/^=+ .* in [0-9.]+s/ {n = 0; for (i = 2; i <= NF; i++) if ($i ~ "^" word) n = $(i - 1)}
      END {print n + 0}' "$log_dir/python-tests.log"
  }
  passed=$((passed + $(pytest_count passed)))
  ignored=$((ignored + $(pytest_count skipped)))
fi
say "steps passed: ${passed_steps[*]}${skipped_steps:+; skipped: ${skipped_steps[*]}}"
echo "tests: $passed passed, 0 failed, $ignored skipped"
