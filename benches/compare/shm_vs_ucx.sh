#!/usr/bin/env bash
# ringfence's shm driver beside UCX's shared-memory transport, alternating
# in one run (this machine's vCPUs move between host cores, so figures
# drift within minutes: only ratios from one run, and medians over rounds,
# mean anything).
#
#   benches/compare/shm_vs_ucx.sh [ROUNDS]      (default 3)
#
# Each round runs, one after the other:
#   1. the criterion bench `shm` (put_bw, put_rate_8B, put_lat_8B through
#      the ring and with `try_now`, and the memcpy baselines), with short
#      warm-up and measurement times;
#   2. ucx_perftest with UCX_TLS=posix, a server and a client process on
#      localhost, once per figure:
#        -t ucp_put_bw  -s 4096 / 65536 / 1048576   (bandwidth)
#        -t ucp_put_bw  -s 8                        (message rate)
#        -t ucp_put_lat -s 8                        (latency, one way)
# and prints every figure; at the end, the median of each over the rounds
# and the ratios. Exit 77 (skip) if ucx_perftest is missing and cannot be
# installed with apt, or python3 (used to read criterion's JSON) is missing.
set -euo pipefail

ROUNDS=${1:-3}
WARMUP=${RF_WARMUP:-1}
MEASURE=${RF_MEASURE:-3}
UCX_ITERS_BW=${UCX_ITERS_BW:-200000}
UCX_ITERS_BIG=${UCX_ITERS_BIG:-20000}
UCX_ITERS_LAT=${UCX_ITERS_LAT:-1000000}
PORT=${UCX_PORT:-13377}
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=$(mktemp -d /tmp/shm_vs_ucx.XXXXXX)

skip() { echo "shm_vs_ucx: SKIPPED: $*" >&2; exit 77; }

command -v python3 >/dev/null || skip "python3 is needed to read criterion's results"
# shellcheck source=benches/compare/ucx.sh
. benches/compare/ucx.sh  # (the working directory is the repository root)
ensure_ucx_perftest

echo "building the bench ..." >&2
cargo bench -p ringfence-benches --bench shm --no-run >"$OUT/build.log" 2>&1 \
    || { cat "$OUT/build.log" >&2; exit 1; }

# ucx TEST SIZE ITERS: see ucx.sh.

# criterion's median for one benchmark id, in ns per iteration.
median_ns() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["median"]["point_estimate"])' \
        "$ROOT/target/criterion/$1/new/estimates.json"
}

RESULTS="$OUT/results.txt"
: >"$RESULTS"
record() { echo "$1 $2" >>"$RESULTS"; printf '  %-28s %s\n' "$1" "$2"; }

for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round of $ROUNDS: ringfence (criterion bench shm)"
    cargo bench -p ringfence-benches --bench shm -- \
        --warm-up-time "$WARMUP" --measurement-time "$MEASURE" >"$OUT/criterion.$round.log" 2>&1 \
        || { tail -30 "$OUT/criterion.$round.log" >&2; exit 1; }
    for size in 4096 65536 1048576; do
        ns=$(median_ns "put_bw/ringfence_shm/$size")
        record "rf_put_bw_$size" "$(python3 -c "print($size / $ns * 1e9 / 2**30)")"
        ns=$(median_ns "put_bw/memcpy/$size")
        record "memcpy_$size" "$(python3 -c "print($size / $ns * 1e9 / 2**30)")"
    done
    ns=$(median_ns "put_rate_8B/ringfence_shm")
    record rf_put_rate_8B "$(python3 -c "print(1e3 / $ns)")"
    ns=$(median_ns "put_lat_8B/ringfence_shm")
    record rf_put_lat_8B "$ns"
    ns=$(median_ns "put_lat_8B/ringfence_shm_now")
    record rf_put_lat_now_8B "$ns"

    echo "== round $round of $ROUNDS: UCX (ucx_perftest, UCX_TLS=posix)"
    for size in 4096 65536 1048576; do
        iters=$UCX_ITERS_BW
        [ "$size" -lt 1048576 ] || iters=$UCX_ITERS_BIG
        read -r _ _ _ _ _ bw _ _ < <(ucx ucp_put_bw "$size" "$iters")
        record "ucx_put_bw_$size" "$(python3 -c "print($bw / 1024)")"
    done
    read -r _ _ _ _ _ _ _ rate < <(ucx ucp_put_bw 8 "$UCX_ITERS_LAT")
    record ucx_put_rate_8B "$(python3 -c "print($rate / 1e6)")"
    read -r _ lat50 _ _ _ _ _ _ < <(ucx ucp_put_lat 8 "$UCX_ITERS_LAT")
    record ucx_put_lat_8B "$(python3 -c "print($lat50 * 1e3)")"
done

python3 - "$RESULTS" "$ROUNDS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    key, value = line.split()
    rows.setdefault(key, []).append(float(value))
m = {k: statistics.median(v) for k, v in rows.items()}
n = sys.argv[2]
print(f"\nmedians over {n} rounds (GiB/s, M msg/s, ns one way)\n")
print(f"{'figure':<22}{'ringfence':>12}{'memcpy':>10}{'UCX posix':>12}{'rf/memcpy':>11}{'rf/UCX':>9}")
for size in (4096, 65536, 1048576):
    rf, mc, ucx = m[f"rf_put_bw_{size}"], m[f"memcpy_{size}"], m[f"ucx_put_bw_{size}"]
    print(f"{'put_bw ' + str(size) + ' B':<22}{rf:>12.2f}{mc:>10.2f}{ucx:>12.2f}{rf / mc:>11.2f}{rf / ucx:>9.2f}")
rf, ucx = m["rf_put_rate_8B"], m["ucx_put_rate_8B"]
print(f"{'put rate 8 B':<22}{rf:>12.2f}{'':>10}{ucx:>12.2f}{'':>11}{rf / ucx:>9.2f}")
rf, ucx = m["rf_put_lat_8B"], m["ucx_put_lat_8B"]
print(f"{'put latency 8 B':<22}{rf:>12.1f}{'':>10}{ucx:>12.1f}{'':>11}{rf / ucx:>9.2f}  (lower is better)")
rf = m["rf_put_lat_now_8B"]
print(f"{'  with try_now':<22}{rf:>12.1f}{'':>10}{ucx:>12.1f}{'':>11}{rf / ucx:>9.2f}  (lower is better)")
print("\nper round:")
for k in sorted(rows):
    print(f"  {k:<22}" + "  ".join(f"{v:.2f}" for v in rows[k]))
PY
echo "logs: $OUT"
