#!/usr/bin/env bash
# Fuzzes the tcp driver's decoders (drivers/tcp/fuzz: frame headers, the
# stream reader, addresses and keys) with cargo-fuzz, each target for a
# while. Not part of scripts/test.sh (CI time); `cargo test -p ringfence-tcp
# --test corpus` replays the committed seed corpus on stable.
#
#   ./scripts/fuzz.sh                 every target, 30 s each
#   ./scripts/fuzz.sh 60              every target, 60 s each
#   ./scripts/fuzz.sh 60 stream       only these targets
#
# New inputs the fuzzer finds go to drivers/tcp/fuzz/corpus-new/<target>
# (ignored by git; the seeds in corpus/ stay as generated), crashes to
# drivers/tcp/fuzz/artifacts/<target>. Needs a nightly toolchain and
# cargo-fuzz (`cargo install cargo-fuzz`); without them it says why and
# exits 77 (skipped).
set -euo pipefail
cd "$(dirname "$0")/../drivers/tcp"

seconds=${1:-30}
[ $# -gt 0 ] && shift
if ! [[ $seconds =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  echo "usage: $0 [SECONDS] [TARGET...]" >&2
  exit 2
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: skipped: no nightly toolchain (rustup toolchain install nightly)" >&2
  exit 77
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: skipped: cargo-fuzz is not installed (cargo install cargo-fuzz)" >&2
  exit 77
fi

if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

failed=()
for target in "${targets[@]}"; do
  printf '\n== fuzz %s for %s s\n' "$target" "$seconds"
  mkdir -p "fuzz/corpus-new/$target"
  # The first directory receives new inputs; the seeds are only read.
  if ! cargo +nightly fuzz run "$target" "fuzz/corpus-new/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -max_len=8192 -print_final_stats=1; then
    failed+=("$target")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs under drivers/tcp/fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz: ${targets[*]}: no failures in $seconds s each"
