#!/usr/bin/env bash
# The peers of ringfence's TCP driver on loopback (127.0.0.1), measured in
# one run (this machine's vCPUs drift within minutes: only figures from one
# run, as medians over rounds, compare):
#
#   benches/compare/tcp_peers.sh [ROUNDS]      (default $ROUNDS, else 3)
#
# Each round runs, one after the other:
#   1. iperf3, a one-shot server (-s -1) and a client with --json, 1 stream
#      and then 4 parallel streams (-P 4): end.sum_received.bits_per_second,
#      the kernel's own TCP ceiling on loopback;
#   2. ucx_perftest with UCX_TLS=tcp UCX_NET_DEVICES=lo, a server and a
#      client process, once per figure:
#        -t ucp_put_lat -s 8         (put latency, one way)
#        -t ucp_am_lat  -s 8         (active-message latency, one way: the
#                                     transport's floor)
#        -t ucp_put_bw  -s 1048576   (put bandwidth)
#      read from the client's "Final:" line (latency: the 50th percentile,
#      which ucx_perftest gives as half a round trip; bandwidth: "overall",
#      in MiB/s).
# Progress and per-round figures go to stderr; at the end, stdout gets one
# line per figure, "name value unit", the median over the rounds:
#   iperf3_1stream_GBps  iperf3_4streams_GBps
#   ucx_tcp_put_lat_8B_us  ucx_tcp_am_lat_8B_us
#   ucx_tcp_put_bw_1MiB_GBps  ucx_tcp_put_bw_1MiB_GiBps
# (GB/s = 10^9 B/s, GiB/s = 2^30 B/s, us = microseconds).
#
# Settings (environment, read at each run, so a caller of the functions
# below may change them between runs):
#   ROUNDS                  rounds (default 3; the first argument wins)
#   TCP_PEERS_IPERF3_TIME   seconds measured per iperf3 run (default 4),
#                           after TCP_PEERS_IPERF3_OMIT seconds left out (1)
#   TCP_PEERS_UCX_ITERS_LAT iterations per latency run (default 20000)
#   TCP_PEERS_UCX_BW_BYTES  bytes per bandwidth run (default 2 GiB, that is
#                           2048 iterations of 1 MiB)
#   TCP_PEERS_TIMEOUT       bound in seconds on every server and client
#                           process (default 60)
# Each run takes a fresh free port (asked of the kernel with python3).
# Defaults take about a minute on this machine's two cores.
#
# Exit 77 (skip) if iperf3 or ucx_perftest is missing and cannot be
# installed with apt-get (iperf3, ucx-utils), or python3 is missing.
#
# As a library: `TCP_PEERS_LIB=1 . benches/compare/tcp_peers.sh` (or any
# `source` of it) only defines the functions below and returns; it sets no
# shell options and no traps. Each figure function does one run and prints
# one number on stdout (its messages go to stderr), returns non-zero on
# failure, and stops its own servers before it returns:
#   peer_ensure               installs or finds iperf3, ucx_perftest and
#                             python3; calls `skip` (the caller's if it has
#                             one, else exit 77) when one cannot be had;
#                             call it once, outside $(...)
#   peer_iperf3 STREAMS       iperf3 throughput, GB/s
#   peer_ucx_put_lat [SIZE]   ucp_put_lat, one way, us (SIZE default 8)
#   peer_ucx_am_lat [SIZE]    ucp_am_lat, one way, us (SIZE default 8)
#   peer_ucx_put_bw SIZE [GB|GiB]
#                             ucp_put_bw, GB/s (or GiB/s)
#   peer_cleanup              stops any server or client still running (also
#                             those started inside $(...)): call it from the
#                             caller's EXIT trap
# Scratch files (logs, the pid list) go to $PEER_OUT, by default $OUT if
# set when sourced, else a fresh /tmp/tcp_peers.XXXXXX.

PEER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PEER_OUT=${PEER_OUT:-${OUT:-$(mktemp -d /tmp/tcp_peers.XXXXXX)}}
# UCX settings for both ucx_perftest processes: its TCP transport only, on
# the loopback interface only.
PEER_UCX_ENV=(UCX_TLS=tcp UCX_NET_DEVICES=lo)

declare -F skip >/dev/null || skip() { echo "tcp_peers: SKIPPED: $*" >&2; exit 77; }

# ensure_ucx_perftest (apt-get install ucx-utils, or skip).
# shellcheck source=benches/compare/ucx.sh
. "$PEER_DIR/ucx.sh"

# Installs iperf3 with apt-get when missing and possible; skips otherwise
# (the same way as ensure_ucx_perftest in ucx.sh).
ensure_iperf3() {
    command -v iperf3 >/dev/null && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing iperf3 with apt-get ..." >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3) \
            >"$PEER_OUT/apt_iperf3.log" 2>&1 || skip "apt-get install iperf3 failed (see $PEER_OUT/apt_iperf3.log)"
    fi
    command -v iperf3 >/dev/null || skip "iperf3 not found (apt-get install iperf3)"
}

peer_ensure() {
    command -v python3 >/dev/null || skip "python3 is needed (free ports, iperf3's JSON, arithmetic)"
    command -v timeout >/dev/null || skip "timeout (coreutils) is needed"
    ensure_iperf3
    OUT=$PEER_OUT ensure_ucx_perftest
}

# A TCP port free right now (the kernel's pick for port 0).
_peer_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1]); s.close()'
}

# _peer_bg NAME CMD...: starts CMD in the background, stdout to
# $PEER_OUT/NAME.out and stderr to $PEER_OUT/NAME.err; its pid goes to
# PEER_LAST_PID and to the pid list that peer_cleanup reads.
_peer_bg() {
    local name=$1
    shift
    "$@" >"$PEER_OUT/$name.out" 2>"$PEER_OUT/$name.err" </dev/null &
    PEER_LAST_PID=$!
    echo "$PEER_LAST_PID" >>"$PEER_OUT/pids"
}

# _peer_forget PID: takes PID off the pid list.
_peer_forget() {
    sed -i "/^$1\$/d" "$PEER_OUT/pids" 2>/dev/null || true
}

# _peer_wait PID: waits for PID to exit; returns its status.
_peer_wait() {
    local rc=0
    wait "$1" 2>/dev/null || rc=$?
    _peer_forget "$1"
    return "$rc"
}

# _peer_stop PID: gives PID two seconds to exit by itself (a server after
# its one test), then stops it (`timeout` passes the TERM on to the tool).
_peer_stop() {
    local n=40
    while [ "$n" -gt 0 ] && kill -0 "$1" 2>/dev/null; do
        sleep 0.05
        n=$((n - 1))
    done
    kill "$1" 2>/dev/null || true
    _peer_wait "$1" || true
}

# _peer_wait_listen PORT PID: waits (up to 10 s) until something listens on
# TCP port PORT; fails early if PID (the server) has exited.
_peer_wait_listen() {
    local hex n=0 files=() f
    hex=$(printf '%04X' "$1")
    for f in /proc/net/tcp /proc/net/tcp6; do
        [ -r "$f" ] && files+=("$f")
    done
    if [ "${#files[@]}" = 0 ]; then  # no procfs: give the server time
        sleep 0.5
        kill -0 "$2" 2>/dev/null
        return
    fi
    # Field 2 is local_address (HEXADDR:PORT), field 4 the state (0A: LISTEN).
    until awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
            "${files[@]}"; do
        kill -0 "$2" 2>/dev/null || return 1
        n=$((n + 1))
        [ "$n" -lt 200 ] || return 1
        sleep 0.05
    done
}

# _peer_fail WHAT NAME...: reports a failed run with the tails of its logs.
_peer_fail() {
    local what=$1 name
    shift
    echo "tcp_peers: $what failed" >&2
    for name in "$@"; do
        tail -n 5 "$PEER_OUT/$name.out" "$PEER_OUT/$name.err" 2>/dev/null | sed 's/^/  /' >&2
    done
    return 1
}

# peer_iperf3 STREAMS: one iperf3 run with STREAMS parallel streams on
# 127.0.0.1; prints the receiver's throughput in GB/s.
peer_iperf3() {
    local streams=${1:?usage: peer_iperf3 STREAMS} port server rc=0
    port=$(_peer_free_port) || return 1
    _peer_bg iperf3_server timeout "${TCP_PEERS_TIMEOUT:-60}" iperf3 -s -1 -B 127.0.0.1 -p "$port"
    server=$PEER_LAST_PID
    if _peer_wait_listen "$port" "$server"; then
        _peer_bg iperf3_client timeout "${TCP_PEERS_TIMEOUT:-60}" iperf3 -c 127.0.0.1 -p "$port" -P "$streams" \
            -t "${TCP_PEERS_IPERF3_TIME:-4}" -O "${TCP_PEERS_IPERF3_OMIT:-1}" --json
        _peer_wait "$PEER_LAST_PID" || rc=$?
    else
        rc=1
    fi
    _peer_stop "$server"
    [ "$rc" = 0 ] || { _peer_fail "iperf3 -P $streams (status $rc)" iperf3_server iperf3_client; return 1; }
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
if "error" in d:
    sys.exit("iperf3: " + d["error"])
print("%.4f" % (d["end"]["sum_received"]["bits_per_second"] / 8e9))
' "$PEER_OUT/iperf3_client.out" || _peer_fail "reading iperf3's JSON" iperf3_client
}

# _peer_ucx TEST SIZE ITERS: one ucx_perftest run over UCX's tcp transport,
# a server and a client on 127.0.0.1, with ITERS/10 warm-up iterations;
# prints the client's "Final:" line's fields: iterations lat_typical
# lat_avg lat_overall bw_avg bw_overall rate_avg rate_overall (usec one
# way, MB/s = MiB/s, msg/s).
_peer_ucx() {
    local test=$1 size=$2 iters=$3 port server rc=0 line
    port=$(_peer_free_port) || return 1
    _peer_bg ucx_server env "${PEER_UCX_ENV[@]}" timeout "${TCP_PEERS_TIMEOUT:-60}" ucx_perftest -p "$port"
    server=$PEER_LAST_PID
    if _peer_wait_listen "$port" "$server"; then
        _peer_bg ucx_client env "${PEER_UCX_ENV[@]}" timeout "${TCP_PEERS_TIMEOUT:-60}" ucx_perftest 127.0.0.1 \
            -p "$port" -t "$test" -s "$size" -n "$iters" -w $((iters / 10 + 1))
        _peer_wait "$PEER_LAST_PID" || rc=$?
    else
        rc=1
    fi
    _peer_stop "$server"
    if ! line=$(grep '^Final:' "$PEER_OUT/ucx_client.out" 2>/dev/null) && [ "$rc" = 0 ]; then
        rc=1  # no summary line
    fi
    [ "$rc" = 0 ] || { _peer_fail "ucx_perftest -t $test -s $size (status $rc)" ucx_server ucx_client; return 1; }
    echo "$line" | awk '{print $2, $3, $4, $5, $6, $7, $8, $9}'
}

# peer_ucx_put_lat [SIZE]: UCP put latency, one way, typical, in us.
peer_ucx_put_lat() {
    local fields
    fields=$(_peer_ucx ucp_put_lat "${1:-8}" "${TCP_PEERS_UCX_ITERS_LAT:-20000}") || return 1
    echo "$fields" | awk '{print $2}'
}

# peer_ucx_am_lat [SIZE]: UCP active-message latency, one way, typical, in us.
peer_ucx_am_lat() {
    local fields
    fields=$(_peer_ucx ucp_am_lat "${1:-8}" "${TCP_PEERS_UCX_ITERS_LAT:-20000}") || return 1
    echo "$fields" | awk '{print $2}'
}

# peer_ucx_put_bw SIZE [GB|GiB]: UCP put bandwidth over TCP_PEERS_UCX_BW_BYTES
# (at least 100 iterations), in GB/s (default) or GiB/s.
peer_ucx_put_bw() {
    local size=${1:?usage: peer_ucx_put_bw SIZE [GB|GiB]} unit=${2:-GB} iters fields
    case $unit in
        GB | GiB) ;;
        *) echo "peer_ucx_put_bw: unit must be GB or GiB, not $unit" >&2; return 1 ;;
    esac
    iters=$((${TCP_PEERS_UCX_BW_BYTES:-2147483648} / size))
    [ "$iters" -ge 100 ] || iters=100
    fields=$(_peer_ucx ucp_put_bw "$size" "$iters") || return 1
    case $unit in
        GB) echo "$fields" | awk '{printf "%.4f\n", $6 * 1048576 / 1e9}' ;;
        GiB) echo "$fields" | awk '{printf "%.4f\n", $6 / 1024}' ;;
    esac
}

# peer_cleanup: stops every process on the pid list (servers and clients
# still running, wherever they were started).
peer_cleanup() {
    local pid
    [ -f "$PEER_OUT/pids" ] || return 0
    while read -r pid; do
        [ -n "$pid" ] && kill "$pid" 2>/dev/null
    done <"$PEER_OUT/pids"
    : >"$PEER_OUT/pids"
    return 0
}

if [ "${TCP_PEERS_LIB:-}" = 1 ] || [ "${BASH_SOURCE[0]}" != "$0" ]; then
    return 0
fi

# ---- run as a script ----
set -euo pipefail

ROUNDS=${1:-${ROUNDS:-3}}
trap peer_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

peer_ensure

RESULTS="$PEER_OUT/results.txt"
: >"$RESULTS"
record() { echo "$1 $2" >>"$RESULTS"; printf '  %-28s %s\n' "$1" "$2" >&2; }
# figure NAME FUNCTION ARGS...: one run of FUNCTION, recorded as NAME.
figure() {
    local name=$1 value
    shift
    value=$("$@") || { echo "tcp_peers: $name failed" >&2; exit 1; }
    record "$name" "$value"
}

for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round of $ROUNDS" >&2
    figure iperf3_1stream_GBps peer_iperf3 1
    figure iperf3_4streams_GBps peer_iperf3 4
    figure ucx_tcp_put_lat_8B_us peer_ucx_put_lat 8
    figure ucx_tcp_am_lat_8B_us peer_ucx_am_lat 8
    figure ucx_tcp_put_bw_1MiB_GBps peer_ucx_put_bw 1048576 GB
done

echo "== medians over $ROUNDS rounds (logs: $PEER_OUT)" >&2
python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    key, value = line.split()
    rows.setdefault(key, []).append(float(value))
m = {k: statistics.median(v) for k, v in rows.items()}
print(f"iperf3_1stream_GBps {m['iperf3_1stream_GBps']:.3f} GB/s")
print(f"iperf3_4streams_GBps {m['iperf3_4streams_GBps']:.3f} GB/s")
print(f"ucx_tcp_put_lat_8B_us {m['ucx_tcp_put_lat_8B_us']:.2f} us")
print(f"ucx_tcp_am_lat_8B_us {m['ucx_tcp_am_lat_8B_us']:.2f} us")
bw = m["ucx_tcp_put_bw_1MiB_GBps"]
print(f"ucx_tcp_put_bw_1MiB_GBps {bw:.3f} GB/s")
print(f"ucx_tcp_put_bw_1MiB_GiBps {bw * 1e9 / 2**30:.3f} GiB/s")
PY
