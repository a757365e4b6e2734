#!/usr/bin/env bash
# ringfence's tcp driver beside its peers on loopback, alternating in one
# run (this machine's vCPUs move between host cores, so figures drift
# within minutes: only ratios from one run, and medians over rounds, mean
# anything).
#
#   benches/compare/tcp.sh [ROUNDS]      (default 3)
#
# Each round runs, one after the other:
#   1. the criterion bench `tcp` (put_bw 64 KiB and 1 MiB on 1 and 4 lanes,
#      put_rate_8B, put_lat_8B, fence_4lanes), `tcp_send` (plain against
#      zero-copy io_uring send, 64 KiB and 1 MiB) and `tcp_floor` (a 64-byte
#      ping-pong on one connection through plain system calls and through
#      io_uring, with a receive armed and by busy receives: the floors
#      under put_lat_8B), with short warm-up and
#      measurement times;
#   2. iperf3 with 1 stream and with 4 (-P 4): the kernel's own TCP ceiling;
#   3. ucx_perftest over UCX's tcp transport (UCX_TLS=tcp,
#      UCX_NET_DEVICES=lo): ucp_put_lat and ucp_am_lat of 8 B (one way),
#      ucp_put_bw of 1 MiB
# (2 and 3 are the functions of tcp_peers.sh), and prints every figure; at
# the end, the medians over the rounds and the ratios the tcp issue sets
# targets for: 1 MiB PUT bandwidth with 4 lanes against iperf3 with 4
# streams (>= 0.9), and 8-byte PUT latency against UCX tcp's (<= 0.5).
# Exit 77 (skip) if iperf3, ucx_perftest or python3 cannot be had.
set -euo pipefail

ROUNDS=${1:-3}
WARMUP=${RF_WARMUP:-1}
MEASURE=${RF_MEASURE:-3}
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=$(mktemp -d /tmp/tcp_compare.XXXXXX)
export PEER_OUT=$OUT

skip() { echo "tcp: SKIPPED: $*" >&2; exit 77; }
TCP_PEERS_LIB=1
# shellcheck source=benches/compare/tcp_peers.sh
. benches/compare/tcp_peers.sh
trap peer_cleanup EXIT
peer_ensure

echo "building the bench ..." >&2
cargo bench -p ringfence-benches --bench tcp --bench tcp_send --bench tcp_floor --no-run >"$OUT/build.log" 2>&1 \
    || { cat "$OUT/build.log" >&2; exit 1; }

# criterion's median for one benchmark id, in ns per iteration.
median_ns() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["median"]["point_estimate"])' \
        "$ROOT/target/criterion/$1/new/estimates.json"
}

RESULTS="$OUT/results.txt"
: >"$RESULTS"
record() { echo "$1 $2" >>"$RESULTS"; printf '  %-30s %s\n' "$1" "$2"; }
figure() {
    local name=$1 value
    shift
    value=$("$@") || { echo "tcp: $name failed" >&2; exit 1; }
    record "$name" "$value"
}

for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round of $ROUNDS: ringfence (criterion bench tcp)"
    cargo bench -p ringfence-benches --bench tcp -- \
        --warm-up-time "$WARMUP" --measurement-time "$MEASURE" >"$OUT/criterion.$round.log" 2>&1 \
        || { tail -30 "$OUT/criterion.$round.log" >&2; exit 1; }
    for lanes in 1 4; do
        for size in 65536 1048576; do
            ns=$(median_ns "put_bw/ringfence_tcp_${lanes}_lanes/$size")
            record "rf_put_bw_${size}_${lanes}lanes_GBps" "$(python3 -c "print($size / $ns)")"
        done
    done
    ns=$(median_ns "put_rate_8B/ringfence_tcp")
    record rf_put_rate_8B_Mps "$(python3 -c "print(1e3 / $ns)")"
    ns=$(median_ns "put_lat_8B/ringfence_tcp")
    record rf_put_lat_8B_us "$(python3 -c "print($ns / 1e3)")"
    for f in no_fence strong_every_8 flush_every_8; do
        ns=$(median_ns "fence_4lanes/$f")
        record "rf_fence_4lanes_${f}_ns" "$ns"
    done
    cargo bench -p ringfence-benches --bench tcp_send -- \
        --warm-up-time "$WARMUP" --measurement-time "$MEASURE" >"$OUT/tcp_send.$round.log" 2>&1 \
        || { tail -30 "$OUT/tcp_send.$round.log" >&2; exit 1; }
    for mode in plain zerocopy; do
        for size in 65536 1048576; do
            ns=$(median_ns "loopback_send/$mode/$size")
            record "send_${mode}_${size}_GBps" "$(python3 -c "print($size / $ns)")"
        done
    done

    cargo bench -p ringfence-benches --bench tcp_floor -- \
        --warm-up-time "$WARMUP" --measurement-time "$MEASURE" >"$OUT/tcp_floor.$round.log" 2>&1 \
        || { tail -30 "$OUT/tcp_floor.$round.log" >&2; exit 1; }
    for how in syscalls io_uring io_uring_spin; do
        ns=$(median_ns "loopback_pingpong/$how")
        record "floor_${how}_us" "$(python3 -c "print($ns / 1e3)")"
    done

    echo "== round $round of $ROUNDS: iperf3, UCX tcp"
    figure iperf3_1stream_GBps peer_iperf3 1
    figure iperf3_4streams_GBps peer_iperf3 4
    figure ucx_tcp_put_lat_8B_us peer_ucx_put_lat 8
    figure ucx_tcp_am_lat_8B_us peer_ucx_am_lat 8
    figure ucx_tcp_put_bw_1MiB_GBps peer_ucx_put_bw 1048576 GB
done

python3 - "$RESULTS" "$ROUNDS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    key, value = line.split()
    rows.setdefault(key, []).append(float(value))
m = {k: statistics.median(v) for k, v in rows.items()}
n = sys.argv[2]
print(f"\nmedians over {n} rounds (GB/s = 1e9 B/s; us one way)\n")
print(f"{'figure':<34}{'ringfence':>11}{'peer':>10}  ratio")
def line(name, rf, peer, label, better):
    print(f"{name:<34}{rf:>11.3f}{peer:>10.3f}  {rf / peer:.2f} ({label}; {better})")
ip1, ip4 = m["iperf3_1stream_GBps"], m["iperf3_4streams_GBps"]
for lanes, ip, streams in ((1, ip1, "1 stream"), (4, ip4, "4 streams")):
    for size in (65536, 1048576):
        rf = m[f"rf_put_bw_{size}_{lanes}lanes_GBps"]
        line(f"put_bw {size} B, {lanes} lane(s)", rf, ip, f"iperf3 {streams}", "higher is better")
rf = m["rf_put_bw_1048576_4lanes_GBps"]
line("put_bw 1 MiB, 4 lanes", rf, m["ucx_tcp_put_bw_1MiB_GBps"], "UCX tcp put_bw", "higher is better")
rf = m["rf_put_lat_8B_us"]
line("put latency 8 B", rf, m["ucx_tcp_put_lat_8B_us"], "UCX tcp put_lat", "lower is better")
line("put latency 8 B", rf, m["ucx_tcp_am_lat_8B_us"], "UCX tcp am_lat", "lower is better")
for how in ("io_uring_spin", "io_uring", "syscalls"):
    line("put latency 8 B", rf, m[f"floor_{how}_us"], f"64 B ping-pong, {how}", "lower is better")
    line(f"64 B ping-pong, {how}", m[f"floor_{how}_us"], m["ucx_tcp_put_lat_8B_us"], "UCX tcp put_lat", "lower is better")
print(f"{'put rate 8 B (M/s)':<34}{m['rf_put_rate_8B_Mps']:>11.3f}")
base = m["rf_fence_4lanes_no_fence_ns"]
for f in ("strong_every_8", "flush_every_8"):
    v = m[f"rf_fence_4lanes_{f}_ns"]
    print(f"{'fence_4lanes ' + f + ' (ns/PUT)':<34}{v:>11.1f}{base:>10.1f}  {v / base:.2f} (no_fence; lower is better)")
for size in (65536, 1048576):
    zc, plain = m[f"send_zerocopy_{size}_GBps"], m[f"send_plain_{size}_GBps"]
    print(f"{'send ' + str(size) + ' B zero-copy':<34}{zc:>11.3f}{plain:>10.3f}  {zc / plain:.2f} (plain send; higher is better)")
print("\nper round:")
for k in sorted(rows):
    print(f"  {k:<32}" + "  ".join(f"{v:.3f}" for v in rows[k]))
PY
echo "logs: $OUT"
