#!/usr/bin/env bash
# Instructions per 8-byte PUT on the ring path and on the direct path
# (`try_now`), stage by stage, counted by callgrind (so the figures do not
# move with this machine's noise): the example `op_cost` runs N PUTs of a
# shm worker connected to itself each way, callgrind counts the loop, and
# the table gives each stage's inclusive instructions per PUT.
# (`op_cost nop N` runs NOPs in batches of 32 instead, for callgrind by hand.)
#
#   benches/compare/op_cost.sh [N]        (N default 100000)
#
# Exit 77 (skip) without valgrind or python3.
set -euo pipefail
N=${1:-100000}
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "op_cost: SKIPPED: valgrind is needed (apt-get install valgrind)" >&2; exit 77; }
command -v python3 >/dev/null || { echo "op_cost: SKIPPED: python3 is needed" >&2; exit 77; }
cargo build -q --release -p ringfence-benches --example op_cost
OUT=$(mktemp -d /tmp/rf_op_cost.XXXXXX)
for path in ring now; do
    valgrind -q --tool=callgrind --callgrind-out-file="$OUT/$path.out" \
        --toggle-collect="*${path}_puts*" target/release/examples/op_cost "$path" "$N"
    callgrind_annotate --inclusive=yes --threshold=100 "$OUT/$path.out" >"$OUT/$path.txt" 2>/dev/null
done
python3 - "$OUT" "$N" <<'PY'
import re, sys
out, n = sys.argv[1], int(sys.argv[2])
# Stage: the functions whose inclusive counts make it up (summed; a stage
# the path does not take reads 0). Names as callgrind_annotate prints them.
STAGES = [
    ("total (the timed loop)", [r"op_cost::(ring|now)_puts$"]),
    ("push the SQE", [r"QueuePair::push$"]),
    ("submit (tail store, NEED_WAKEUP check)", [r"QueuePair::submit$"]),
    ("engine lock and core-thread wake check", [r"worker::Shared::engine$"]),
    ("progress round (all of it)", [r"Worker::progress$"]),
    ("try_now (all of it)", [r"QueuePair::try_now$"]),
    ("  intake: SQ read, runs, validation", [r"Engine>::intake$"]),
    ("  SQ read (consumer)", [r"Consumer<T>::refresh_tail$", r"Consumer<T>::pop_batch$"]),
    ("  direct admission: endpoint, W = C, key and bounds", [r"Engine>::extends_run$"]),
    ("  the run and its CQEs (execute_run)", [r"Engine>::execute_run$"]),
    ("  run_now: try_now's checks and its run", [r"Engine>::run_now$"]),
    ("  the run handed to the driver (execute_ops)", [r"Engine>::execute_ops$"]),
    ("    shm execute: liveness word, bounds, copy", [r"DirectPath for ringfence_shm::driver::Shm>::execute(_one)?$"]),
    ("  polling the drivers", [r"Engine>::poll_drivers$"]),
    ("  dispatch passes", [r"Engine>::dispatch_pass$"]),
    ("  notifications", [r"NotifyPool::drain$"]),
    ("  CQ publish", [r"EngineQueue::publish$"]),
    ("the PUT's source store (the bench's own)", [r"RegisteredBuf::store_u64$"]),
]
def load(path):
    costs = {}
    for line in open(f"{out}/{path}.txt"):
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(\S+?):(.+?)\s*(\[.*\])?$", line)
        if m:
            name = m.group(3).strip()
            costs[name] = max(costs.get(name, 0), int(m.group(1).replace(",", "")))
    return costs
ring, now = load("ring"), load("now")
def stage(costs, pats):
    return sum(v for k, v in costs.items() if any(re.search(p, k) for p in pats)) / n
print(f"instructions per 8-byte PUT over shm (callgrind, {n} PUTs each way)")
print(f"{'stage':54} {'ring':>8} {'try_now':>8}")
for name, pats in STAGES:
    print(f"{name:54} {stage(ring, pats):8.0f} {stage(now, pats):8.0f}")
PY
echo "(callgrind output: $OUT)"
