#!/usr/bin/env bash
# rfbench (shm driver, two processes) beside ucx_perftest (UCX_TLS=posix,
# server and client on localhost), alternating figure by figure in one run
# (this machine's vCPUs drift within minutes: only ratios from one run, and
# medians over rounds, mean anything).
#
#   benches/compare/rfbench_vs_ucx.sh [ROUNDS]      (default 3)
#
# Figures, each from one rfbench run and one ucx_perftest run per round:
#   put latency 8 B     rfbench --mode latency, 8 B: typical (median) one way
#                       ucx_perftest -t ucp_put_lat -s 8: typical latency
#   put bw 64 KiB       rfbench WRITE, 64 KiB, batch $RF_BATCH: B/W
#   put bw 1 MiB        rfbench WRITE, 1 MiB, batch $RF_BATCH: B/W
#                       ucx_perftest -t ucp_put_bw -s 65536 / 1048576: bandwidth
#   msg rate 8 B        rfbench WRITE, 8 B, batch 128: transfers per second
#                       ucx_perftest -t ucp_put_bw -s 8: message rate
# plus, rfbench only, the nixlbench WRITE row at 64 KiB, batch 1, --notify.
# Bandwidths are in GB/s (10^9 B/s; UCX's MB/s are MiB/s and converted),
# rates in millions of messages per second, latencies in microseconds.
#
# Exit 77 (skip) if ucx_perftest is missing and cannot be installed with
# apt-get (ucx-utils), or python3 is missing.
set -euo pipefail

ROUNDS=${1:-3}
RF_BATCH=${RF_BATCH:-4}
PORT=${UCX_PORT:-13379}
UCX_ITERS_LAT=${UCX_ITERS_LAT:-200000}
UCX_ITERS_RATE=${UCX_ITERS_RATE:-2000000}
UCX_ITERS_64K=${UCX_ITERS_64K:-40000}
UCX_ITERS_1M=${UCX_ITERS_1M:-4000}
cd "$(dirname "$0")/../.."
OUT=$(mktemp -d /tmp/rfbench_vs_ucx.XXXXXX)

skip() { echo "rfbench_vs_ucx: SKIPPED: $*" >&2; exit 77; }

command -v python3 >/dev/null || skip "python3 is needed to read rfbench's JSON"
# shellcheck source=benches/compare/ucx.sh
. benches/compare/ucx.sh  # (the working directory is the repository root)
ensure_ucx_perftest

echo "building rfbench (release) ..." >&2
cargo build --release -p ringfence-tools --bin rfbench >"$OUT/build.log" 2>&1 \
    || { cat "$OUT/build.log" >&2; exit 1; }
RF=target/release/rfbench

# ucx TEST SIZE ITERS: see ucx.sh.

# One field of the last JSON line of an rfbench run.
rf() {
    local field=$1
    shift
    "$RF" --json "$@" >"$OUT/rf.json" 2>"$OUT/rf.err" || { cat "$OUT/rf.err" >&2; return 1; }
    python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])' \
        "$OUT/rf.json" "$field"
}

RESULTS="$OUT/results.txt"
: >"$RESULTS"
record() { echo "$1 $2" >>"$RESULTS"; printf '  %-22s %s\n' "$1" "$2"; }
calc() { python3 -c "print($1)"; }

for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round of $ROUNDS"
    record rf_lat_8 "$(rf typical_lat_us --mode latency --start-block-size 8 --max-block-size 8 \
        --num-iter 200000 --warmup-iter 10000)"
    read -r _ lat _ _ _ _ _ _ < <(ucx ucp_put_lat 8 "$UCX_ITERS_LAT")
    record ucx_lat_8 "$lat"

    for size in 65536 1048576; do
        iters=$((2000 * 65536 / size * 16 / RF_BATCH + 20))
        record "rf_bw_$size" "$(rf bw_gb_per_sec --start-block-size "$size" --max-block-size "$size" \
            --start-batch-size "$RF_BATCH" --max-batch-size "$RF_BATCH" --num-iter "$iters" --warmup-iter 10)"
        n=$UCX_ITERS_64K
        [ "$size" -lt 1048576 ] || n=$UCX_ITERS_1M
        read -r _ _ _ _ _ bw _ _ < <(ucx ucp_put_bw "$size" "$n")
        record "ucx_bw_$size" "$(calc "$bw * 2**20 / 1e9")"
    done

    lat=$(rf avg_lat_us --start-block-size 8 --max-block-size 8 --start-batch-size 128 \
        --max-batch-size 128 --num-iter 20000 --warmup-iter 1000)
    record rf_rate_8 "$(calc "1 / $lat")"
    read -r _ _ _ _ _ _ _ rate < <(ucx ucp_put_bw 8 "$UCX_ITERS_RATE")
    record ucx_rate_8 "$(calc "$rate / 1e6")"

    "$RF" --start-block-size 64K --max-block-size 64K --max-batch-size 1 --notify \
        --num-iter 20000 --warmup-iter 1000 >"$OUT/nixl_row.$round.txt"
    tail -1 "$OUT/nixl_row.$round.txt" | sed 's/^/  nixlbench row: /'
    record rf_notify_64k_bw "$(tail -1 "$OUT/nixl_row.$round.txt" | awk '{print $3}')"
done

python3 - "$RESULTS" "$ROUNDS" "$RF_BATCH" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    key, value = line.split()
    rows.setdefault(key, []).append(float(value))
m = {k: statistics.median(v) for k, v in rows.items()}
n, batch = sys.argv[2], sys.argv[3]
print(f"\nmedians over {n} rounds (rfbench: shm driver, two processes; UCX: UCX_TLS=posix)\n")
print(f"{'figure':<34}{'rfbench':>12}{'ucx_perftest':>14}{'rf vs UCX':>11}")
def line(name, rf, ucx, lower_better=False):
    ratio = ucx / rf if lower_better else rf / ucx
    print(f"{name:<34}{rf:>12.3f}{ucx:>14.3f}{ratio:>10.2f}x")
line("put latency 8 B (us, one way)", m["rf_lat_8"], m["ucx_lat_8"], lower_better=True)
line(f"put bw 64 KiB (GB/s; rf batch {batch})", m["rf_bw_65536"], m["ucx_bw_65536"])
line(f"put bw 1 MiB (GB/s; rf batch {batch})", m["rf_bw_1048576"], m["ucx_bw_1048576"])
line("msg rate 8 B (M msg/s)", m["rf_rate_8"], m["ucx_rate_8"])
print(f"{'WRITE 64 KiB batch 1 --notify (GB/s)':<34}{m['rf_notify_64k_bw']:>12.3f}")
print("\n'rf vs UCX' > 1 means rfbench is ahead (for latency: UCX's time over rfbench's).")
print("\nper round:")
for k in sorted(rows):
    print(f"  {k:<22}" + "  ".join(f"{v:.3f}" for v in rows[k]))
PY
echo "logs: $OUT"
