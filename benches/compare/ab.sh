#!/usr/bin/env bash
# Two builds of ringfence side by side: the working tree against a base
# revision, alternating in one run (this machine's vCPUs move between host
# cores, so only figures taken in one run, as medians over rounds, compare).
#
#   benches/compare/ab.sh BASE [ROUNDS]      (ROUNDS default 5)
#
# BASE is any git revision (say the commit before a change). It is checked
# out into a temporary worktree and built there with its own target
# directory; the working tree is built as it is. Each round runs, for each
# build in turn (the order swaps every round):
#   - criterion bench `shm`: put_rate_8B/ringfence_shm (message rate),
#     put_lat_8B/ringfence_shm (ping-pong through the ring) and
#     put_lat_8B/ringfence_shm_now (through `try_now`);
#   - criterion bench `engine`: nop_roundtrip/ringfence (inline and with
#     the core thread) and wake/ringfence/core_thread_asleep (an 8-byte
#     PUT submitted to a sleeping core thread, until its CQE);
#   - criterion bench `tcp`: put_lat_8B/ringfence_tcp (ping-pong with a
#     peer process over loopback TCP);
#   - criterion bench `fence`: fence_cost (ns per PUT with no fence, weak
#     and strong fences every 8 PUTs).
# and prints each figure; at the end, per figure, the median of each build
# over the rounds and the ratio new/base (for times, below 1 is faster; for
# the rate, above 1 is faster). Exit 77 (skip) if python3 is missing.
set -euo pipefail

BASE=${1:?usage: benches/compare/ab.sh BASE [ROUNDS]}
ROUNDS=${2:-5}
WARMUP=${RF_WARMUP:-1}
MEASURE=${RF_MEASURE:-3}
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=$(mktemp -d /tmp/rf_ab.XXXXXX)

command -v python3 >/dev/null || { echo "ab: SKIPPED: python3 is needed" >&2; exit 77; }

# build DIR TARGET: the bench executables of the checkout in DIR, built
# into TARGET; prints "shm=PATH engine=PATH fence=PATH tcp=PATH".
build() {
    (cd "$1" && CARGO_TARGET_DIR=$2 cargo bench -p ringfence-benches --bench shm --bench engine --bench fence \
        --bench tcp --no-run --message-format=json 2>"$OUT/build.err") \
        | python3 -c '
import json, sys
exes = {}
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("shm", "engine", "fence", "tcp"):
        exes[m["target"]["name"]] = m["executable"]
print("shm=%s engine=%s fence=%s tcp=%s" % (exes["shm"], exes["engine"], exes["fence"], exes["tcp"]))
' || { cat "$OUT/build.err" >&2; exit 1; }
}

BASE_DIR="$OUT/base"
git worktree add --detach -q "$BASE_DIR" "$BASE"
trap 'git -C "$ROOT" worktree remove --force "$BASE_DIR" 2>/dev/null || true' EXIT
echo "building base ($BASE) ..." >&2
eval "base_$(build "$BASE_DIR" "${RF_AB_BASE_TARGET:-/tmp/rf_ab_base_target}" | sed 's/ / base_/g')"
echo "building new (working tree) ..." >&2
eval "new_$(build "$ROOT" "$ROOT/target" | sed 's/ / new_/g')"

# median_ns HOME ID: criterion's median for one benchmark id, in ns.
median_ns() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["median"]["point_estimate"])' \
        "$1/$2/new/estimates.json"
}

RESULTS="$OUT/results.txt"
: >"$RESULTS"
record() { echo "$1 $2 $3" >>"$RESULTS"; printf '  %-5s %-34s %s\n' "$1" "$2" "$3"; }

# run_build NAME SHM ENGINE FENCE TCP ROUND
run_build() {
    local name=$1 shm=$2 engine=$3 fence=$4 tcp=$5 round=$6 home="$OUT/criterion.$1.$6"
    local args=(--bench --warm-up-time "$WARMUP" --measurement-time "$MEASURE")
    (cd "$ROOT" && CRITERION_HOME=$home "$shm" "${args[@]}" 'put_rate_8B/ringfence_shm$|put_lat_8B/ringfence_shm' \
        >"$OUT/$name.shm.$round.log" 2>&1) || { tail -30 "$OUT/$name.shm.$round.log" >&2; exit 1; }
    (cd "$ROOT" && CRITERION_HOME=$home "$engine" "${args[@]}" 'nop_roundtrip/ringfence|wake/ringfence' \
        >"$OUT/$name.engine.$round.log" 2>&1) || { tail -30 "$OUT/$name.engine.$round.log" >&2; exit 1; }
    record "$name" put_rate_8B_Mops "$(python3 -c "print(1e3 / $(median_ns "$home" put_rate_8B/ringfence_shm))")"
    record "$name" put_lat_8B_ring_ns "$(median_ns "$home" put_lat_8B/ringfence_shm)"
    record "$name" put_lat_8B_now_ns "$(median_ns "$home" put_lat_8B/ringfence_shm_now)"
    record "$name" nop_inline_ns "$(median_ns "$home" 'nop_roundtrip/ringfence_inline_batch32')"
    record "$name" nop_core_thread_ns "$(median_ns "$home" 'nop_roundtrip/ringfence_core_thread_batch32')"
    record "$name" wake_asleep_ns "$(median_ns "$home" 'wake/ringfence_core_thread_asleep')"
    (cd "$ROOT" && CRITERION_HOME=$home "$tcp" "${args[@]}" 'put_lat_8B/ringfence_tcp$' \
        >"$OUT/$name.tcp.$round.log" 2>&1) || { tail -30 "$OUT/$name.tcp.$round.log" >&2; exit 1; }
    record "$name" tcp_put_lat_8B_ns "$(median_ns "$home" put_lat_8B/ringfence_tcp)"
    (cd "$ROOT" && CRITERION_HOME=$home "$fence" "${args[@]}" 'fence_cost' \
        >"$OUT/$name.fence.$round.log" 2>&1) || { tail -30 "$OUT/$name.fence.$round.log" >&2; exit 1; }
    local kind
    for kind in no_fence no_fence_one_lane weak_every_8 strong_every_8 strong_every_8_blocking; do
        record "$name" "fence_$kind" "$(median_ns "$home" "fence_cost/$kind")"
    done
}

for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round of $ROUNDS"
    if [ $((round % 2)) = 1 ]; then
        run_build base "$base_shm" "$base_engine" "$base_fence" "$base_tcp" "$round"
        run_build new "$new_shm" "$new_engine" "$new_fence" "$new_tcp" "$round"
    else
        run_build new "$new_shm" "$new_engine" "$new_fence" "$new_tcp" "$round"
        run_build base "$base_shm" "$base_engine" "$base_fence" "$base_tcp" "$round"
    fi
done

echo "== medians over $ROUNDS rounds (base $BASE, new = working tree)"
python3 - "$RESULTS" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    build, figure, value = line.split()
    rows.setdefault(figure, {}).setdefault(build, []).append(float(value))
print(f"{'figure':<22} {'base':>10} {'new':>10} {'new/base':>9}")
for figure, builds in rows.items():
    b, n = statistics.median(builds["base"]), statistics.median(builds["new"])
    print(f"{figure:<22} {b:>10.2f} {n:>10.2f} {n / b:>9.3f}")
EOF
echo "(logs and criterion data: $OUT)"
