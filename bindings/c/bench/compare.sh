#!/usr/bin/env bash
# The C path against the Rust path: 8-byte PUTs over the shm driver into a
# peer process, batch 32, SKIP_SUCCESS, progress after each submit, one
# FLUSH per sample. Alternates, ROUNDS times,
#
#   1. bindings/c/bench/put_rate.c (SQEs written by the inline helpers of
#      ringfence.h, libringfence built with the bench profile), and
#   2. cargo bench -p ringfence-benches --bench shm -- put_rate_8B/ringfence_shm
#      (criterion; its median),
#
# and prints each round's figures, the medians over the rounds, and the
# ratio C/Rust (the target is at least 0.9). Alternating rounds, and medians
# over them, keep a noisy shared machine from favouring either side.
#
#   bindings/c/bench/compare.sh [ROUNDS]     default 3
#
# Environment: RF_SAMPLES and RF_PUTS (C: samples per round and PUTs per
# sample; default 20 and 2,000,000), RF_WARMUP and RF_MEASURE (criterion's
# seconds; default 1 and 3).
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
ROUNDS=${1:-3}
SAMPLES=${RF_SAMPLES:-20}
PUTS=${RF_PUTS:-2000000}
WARMUP=${RF_WARMUP:-1}
MEASURE=${RF_MEASURE:-3}
OUT=$ROOT/target/c-bench
mkdir -p "$OUT"
command -v python3 >/dev/null || { echo "python3 is needed to read criterion's results" >&2; exit 77; }

echo "building ..." >&2
# The bench profile (release, LTO, one codegen unit), as `cargo bench` uses
# for the Rust side; its output directory is target/release.
cargo build --profile bench -p ringfence-c --locked >"$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log" >&2; exit 1; }
gcc -std=c11 -O2 -Wall -Wextra -Werror -I"$ROOT/bindings/c/include" \
    "$ROOT/bindings/c/bench/put_rate.c" -o "$OUT/put_rate" \
    -L"$ROOT/target/release" -Wl,-rpath,"$ROOT/target/release" -lringfence
cargo bench -p ringfence-benches --bench shm --locked --no-run >>"$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log" >&2; exit 1; }

RESULTS=$OUT/results.txt
: >"$RESULTS"
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round of $ROUNDS: C (bindings/c/bench/put_rate)"
    "$OUT/put_rate" "$SAMPLES" "$PUTS" >"$OUT/c.$round.log"
    c=$(sed -n 's/^msgs_per_sec=//p' "$OUT/c.$round.log")
    echo "c_inline $c" >>"$RESULTS"
    printf '   C:    %.2f M msg/s\n' "$(python3 -c "print($c / 1e6)")"

    echo "== round $round of $ROUNDS: Rust (cargo bench --bench shm -- put_rate_8B/ringfence_shm)"
    cargo bench -p ringfence-benches --bench shm --locked -- put_rate_8B/ringfence_shm \
        --warm-up-time "$WARMUP" --measurement-time "$MEASURE" >"$OUT/rust.$round.log" 2>&1 \
        || { tail -30 "$OUT/rust.$round.log" >&2; exit 1; }
    ns=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["median"]["point_estimate"])' \
        "$ROOT/target/criterion/put_rate_8B/ringfence_shm/new/estimates.json")
    rust=$(python3 -c "print(1e9 / $ns)")
    echo "rust $rust" >>"$RESULTS"
    printf '   Rust: %.2f M msg/s\n' "$(python3 -c "print($rust / 1e6)")"
done

python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, value = line.split()
    rows.setdefault(name, []).append(float(value))
c, rust = statistics.median(rows["c_inline"]), statistics.median(rows["rust"])
n = len(rows["rust"])
print(f"\nput_rate_8B over shm, medians of {n} rounds:")
print(f"  C (inline helpers)   {c / 1e6:8.2f} M msg/s   rounds: " + ", ".join(f"{v / 1e6:.2f}" for v in rows["c_inline"]))
print(f"  Rust (QueuePair)     {rust / 1e6:8.2f} M msg/s   rounds: " + ", ".join(f"{v / 1e6:.2f}" for v in rows["rust"]))
print(f"  ratio C/Rust         {c / rust:8.3f}   (target >= 0.9)")
PY
