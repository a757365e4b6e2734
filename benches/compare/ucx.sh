# Shared by the comparison scripts in this folder (sourced, not run).
#
# Expects: $OUT (a scratch folder), $PORT (a free TCP port on localhost),
# and a `skip` function that prints why and exits 77.

# Installs ucx-utils with apt when missing and possible; skips otherwise.
ensure_ucx_perftest() {
    command -v ucx_perftest >/dev/null && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing ucx-utils with apt-get ..." >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ucx-utils) \
            >"$OUT/apt.log" 2>&1 || skip "apt-get install ucx-utils failed (see $OUT/apt.log)"
    fi
    command -v ucx_perftest >/dev/null || skip "ucx_perftest not found (apt-get install ucx-utils)"
}

# One ucx_perftest client run (UCX_TLS=posix) against a fresh server on
# localhost; prints the "Final:" line's fields: iterations lat_typical
# lat_avg lat_overall bw_avg bw_overall rate_avg rate_overall (usec,
# MB/s = MiB/s, msg/s).
ucx() {
    local test=$1 size=$2 iters=$3
    UCX_TLS=posix ucx_perftest -p "$PORT" >"$OUT/ucx_server.log" 2>&1 &
    local server=$! tries=0 line=""
    while :; do
        if line=$(UCX_TLS=posix timeout 120 ucx_perftest localhost -p "$PORT" \
                -t "$test" -s "$size" -n "$iters" 2>"$OUT/ucx_client.err" | grep '^Final:'); then
            break
        fi
        tries=$((tries + 1))
        # The server may not be listening yet.
        [ "$tries" -lt 50 ] || { kill "$server" 2>/dev/null; cat "$OUT/ucx_client.err" >&2; return 1; }
        sleep 0.1
    done
    wait "$server" 2>/dev/null || true
    echo "$line" | awk '{print $2, $3, $4, $5, $6, $7, $8, $9}'
}
