#!/usr/bin/env bash
# Aggregate bandwidth of `rfbench --bootstrap` over a bridge, beside iperf3
# between the same network namespaces, in one run:
#
#   benches/compare/ranks_vs_iperf3.sh [ROUNDS]     (default 3)
#
# Builds four hosts (network namespaces) on one switch (a namespace with a
# bridge, 10.77.0.0/24; the switch is .254, host i is .i+1), starts an
# etcd server on the switch, and then, for 2 and then 4 ranks, each round:
#   1. rfbench, one rank per host, nixlbench's pairwise scheme (rank i
#      writes to rank i + N/2, every pair at once), 1 MiB WRITEs, batch 1,
#      4 lanes, over the tcp driver, bootstrapped through the etcd server;
#      the figure is rank 0's aggregate row (the pairs' bandwidths summed);
#   2. iperf3 between the same pairs at the same time, 4 parallel streams
#      per pair (one per lane): the sum of end.sum_received over the pairs.
# Per-round figures go to stderr; stdout gets, per rank count, the
# medians and their ratio ("ranks N: rfbench X GB/s, iperf3 Y GB/s,
# ratio R"). GB/s = 10^9 B/s.
#
# Needs root (namespaces), ip, etcd (etcd-server), iperf3 and python3;
# exit 77 (skip) when one is missing. Settings: RANKS_ITERS (1 MiB writes
# per rfbench row, default 2000), RANKS_IPERF3_TIME (seconds, default 4).
set -euo pipefail
ROUNDS=${1:-3}
ITERS=${RANKS_ITERS:-2000}
IPERF_TIME=${RANKS_IPERF3_TIME:-4}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$(mktemp -d /tmp/ranks_vs_iperf3.XXXXXX)
skip() { echo "ranks_vs_iperf3: SKIPPED: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
for tool in ip etcd iperf3 python3; do
  command -v "$tool" >/dev/null || skip "$tool not found"
done

pfx="rfb$$"
sw="$pfx-sw"
hosts=("$pfx-h0" "$pfx-h1" "$pfx-h2" "$pfx-h3")
ipof() { echo "10.77.0.$(($1 + 1))"; }
cleanup() {
  for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in "$sw" "${hosts[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT

ip netns add "$sw"
ip -n "$sw" link set lo up
ip -n "$sw" link add br0 type bridge
for i in 0 1 2 3; do
  h=${hosts[$i]}
  ip netns add "$h"
  ip -n "$h" link set lo up
  ip -n "$sw" link add "vh$i" type veth peer name eth0 netns "$h"
  ip -n "$sw" link set "vh$i" master br0
  ip -n "$sw" link set "vh$i" up
  ip -n "$h" link set eth0 up
  ip -n "$h" addr add "$(ipof "$i")/24" dev eth0
done
ip -n "$sw" link set br0 up
ip -n "$sw" addr add 10.77.0.254/24 dev br0

echo "building rfbench (release) ..." >&2
cargo build --release --locked -q -p ringfence-tools --bin rfbench --manifest-path "$root/Cargo.toml"
rfbench=$root/target/release/rfbench

c=http://10.77.0.254:2379 p=http://10.77.0.254:2380
ip netns exec "$sw" etcd --name sw --data-dir "$out/etcd" --logger zap --log-level error \
  --listen-client-urls $c --advertise-client-urls $c --listen-peer-urls $p \
  --initial-advertise-peer-urls $p --initial-cluster sw=$p >"$out/etcd.log" 2>&1 &
for _ in $(seq 200); do
  ip netns exec "${hosts[0]}" bash -c 'exec 3<>/dev/tcp/10.77.0.254/2379' 2>/dev/null && break
  sleep 0.05
done

# One rfbench run of N ranks; prints the aggregate GB/s.
rfbench_run() {
  local n=$1 run=$2 i pids=()
  for ((i = 0; i < n; i++)); do
    ip netns exec "${hosts[$i]}" env -u RINGFENCE_TCP_ADDR "$rfbench" \
      --bootstrap "etcd://10.77.0.254:2379?run=$run&size=$n&rank=$i" \
      --driver tcp --lanes 4 --op write --start-block-size 1048576 --max-block-size 1048576 \
      --max-batch-size 1 --num-iter "$ITERS" --warmup-iter 100 --json ${RANKS_RFBENCH_ARGS:-} \
      >"$out/$run.$i.out" 2>"$out/$run.$i.err" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$out/$run".*.err >&2; return 1; }; done
  python3 -c 'import json,sys; o=[json.loads(l) for l in open(sys.argv[1])]; print(o[-1]["rows"][0]["bw_gb_per_sec"])' "$out/$run.0.out"
}

# iperf3 between the same pairs at once; prints the summed GB/s.
iperf3_run() {
  local n=$1 tag=$2 half=$(($1 / 2)) i pids=() files=()
  for ((i = 0; i < half; i++)); do
    ip netns exec "${hosts[$((i + half))]}" iperf3 -s -1 -B "$(ipof $((i + half)))" >/dev/null 2>&1 &
  done
  for ((i = 0; i < half; i++)); do
    # Retried while the server is not listening yet (a refused client
    # does not use up the one-shot server; a probe connection would).
    (for _ in $(seq 400); do
      ip netns exec "${hosts[$i]}" iperf3 -c "$(ipof $((i + half)))" -P 4 -t "$IPERF_TIME" -O 1 --json \
        >"$out/$tag.$i.json" || true
      grep -q '"sum_received"' "$out/$tag.$i.json" && break
      sleep 0.05
    done) &
    pids+=($!)
    files+=("$out/$tag.$i.json")
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  python3 -c 'import json,sys; print(sum(json.load(open(f))["end"]["sum_received"]["bits_per_second"] for f in sys.argv[1:]) / 8e9)' "${files[@]}"
}

median() { python3 -c 'import statistics,sys; print(statistics.median(float(a) for a in sys.argv[1:]))' "$@"; }

for n in 2 4; do
  rf=() ip3=()
  for ((r = 1; r <= ROUNDS; r++)); do
    a=$(rfbench_run "$n" "bw-$n-$r-$$")
    b=$(iperf3_run "$n" "ip-$n-$r")
    echo "ranks $n round $r: rfbench $a GB/s, iperf3 $b GB/s" >&2
    rf+=("$a") ip3+=("$b")
  done
  mr=$(median "${rf[@]}") mi=$(median "${ip3[@]}")
  echo "ranks $n: rfbench $mr GB/s, iperf3 $mi GB/s, ratio $(python3 -c "print(round($mr / $mi, 3))")"
done
