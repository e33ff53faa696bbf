#!/usr/bin/env bash
# A throwaway single-member etcd for tests, from Debian's `etcd-server` package.
#
#   scripts/etcd.sh start    # install if absent, start on 127.0.0.1:2379, wait until it answers
#   scripts/etcd.sh stop     # stop what `start` started (nothing if it started nothing)
#   scripts/etcd.sh status   # does something answer on the port?
#
# The same contract as scripts/zookeeper.sh: `start` does nothing when something already
# answers on the port (a developer's own etcd, or CI's service) and then records nothing,
# so `stop` stops nothing; it only ever stops the process whose pid `start` wrote. Runs
# sharing a machine may nest: a `start` that finds our own server up counts one more user,
# and `stop` only stops it when the last user stops. Pair each `start` with one `stop`.
#
# The member listens on loopback only (clients on MULTILOCK_ETCD_PORT, default 2379; peers
# on MULTILOCK_ETCD_PEER_PORT, default the client port + 1), keeps its data under
# $MULTILOCK_ETCD_DIR (default: a directory in /dev/shm where there is one, else $TMPDIR:
# every write is fsynced, and tests write a lot), fresh at each start unless
# MULTILOCK_ETCD_KEEP_DATA=1 (fault tests restart a private server on its data). A short
# election timeout lowers the shortest lease etcd grants (1.5 election timeouts, rounded
# up to whole seconds) from 2 s to 1 s, so that tests may use 1 s leases.
# MULTILOCK_ETCD_ARGS adds flags (a private server of the authentication tests: a short
# --auth-token-ttl).
set -euo pipefail

PORT="${MULTILOCK_ETCD_PORT:-2379}"
PEER_PORT="${MULTILOCK_ETCD_PEER_PORT:-$((PORT + 1))}"
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    default_state="/dev/shm/multilock-etcd-$(id -u)-$PORT"
else
    default_state="${TMPDIR:-/tmp}/multilock-etcd-$(id -u)-$PORT"
fi
STATE="${MULTILOCK_ETCD_DIR:-$default_state}"
PIDFILE="$STATE/etcd.pid"
WAIT_SECONDS="${MULTILOCK_ETCD_WAIT:-60}"
KEEP_DATA="${MULTILOCK_ETCD_KEEP_DATA:-0}"

log() { echo "etcd.sh: $*" >&2; }

# GET /health over bash's /dev/tcp: no curl needed on a fresh machine.
answers() {
    local reply
    reply="$( (
        exec 3<>"/dev/tcp/127.0.0.1/$PORT" || exit 1
        printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
        timeout 2 cat <&3 || true
    ) 2>/dev/null)" || return 1
    [[ "$reply" == *'"health":"true"'* ]]
}

listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

install_etcd() {
    # etcdctl (etcd-client) too: the fault tests revoke leases and add users with it.
    if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; then
        return 0
    fi
    log "installing Debian's etcd-server and etcd-client packages"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        etcd-server etcd-client >/dev/null
}

# One `start`/`stop` at a time (several test runs may share the machine).
serialize() {
    mkdir -p "$STATE"
    exec 9>"$STATE/lock"
    flock 9
}

# The pid `start` recorded, if that process still runs with our data directory.
our_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 1
    pid="$(cat "$PIDFILE")"
    kill -0 "$pid" 2>/dev/null && grep -qF "$STATE/data" "/proc/$pid/cmdline" 2>/dev/null || return 1
    echo "$pid"
}

users() { cat "$STATE/users" 2>/dev/null || echo 0; }

start() {
    serialize
    install_etcd # also where a server runs: the tests use this machine's etcdctl
    if listening; then
        if our_pid >/dev/null; then
            echo $(($(users) + 1)) >"$STATE/users"
            log "our etcd already answers on 127.0.0.1:$PORT ($(users) users)"
        else
            log "something already listens on 127.0.0.1:$PORT; using it, starting nothing"
        fi
        return 0
    fi
    if [ "$KEEP_DATA" != 1 ]; then
        rm -rf "$STATE/data"
    fi
    local client="http://127.0.0.1:$PORT" peer="http://127.0.0.1:$PEER_PORT"
    # setsid: the server outlives this script but not a `stop`. The logger is zap (the
    # default of 3.5; 3.4's capnslog is deprecated), errors only.
    setsid etcd --name multilock-test --data-dir "$STATE/data" \
        --listen-client-urls "$client" --advertise-client-urls "$client" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "multilock-test=$peer" --initial-cluster-state new \
        --heartbeat-interval 50 --election-timeout 500 \
        --logger zap --log-level error --log-outputs stderr ${MULTILOCK_ETCD_ARGS:-} \
        >"$STATE/etcd.log" 2>&1 </dev/null 9>&- &
    local pid=$!
    echo "$pid" >"$PIDFILE"
    echo 1 >"$STATE/users"
    local deadline=$((SECONDS + WAIT_SECONDS))
    while ! answers; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "etcd exited during startup; its output:"
            cat "$STATE/etcd.log" >&2 2>/dev/null || true
            rm -f "$PIDFILE" "$STATE/users"
            return 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "etcd did not answer /health within ${WAIT_SECONDS}s; stopping it"
            kill_server "$pid"
            return 1
        fi
        sleep 0.1
    done
    log "etcd $pid answers on 127.0.0.1:$PORT (state in $STATE)"
}

stop() {
    serialize
    local pid
    if ! pid="$(our_pid)"; then
        rm -f "$PIDFILE" "$STATE/users" # nothing of ours runs (never started, or it died)
        return 0
    fi
    local left=$(($(users) - 1))
    if [ "$left" -gt 0 ]; then
        echo "$left" >"$STATE/users"
        log "etcd $pid stays up for $left other user(s)"
        return 0
    fi
    kill_server "$pid"
}

kill_server() {
    local pid="$1"
    kill -CONT "$pid" 2>/dev/null || true # a frozen server would not stop
    kill "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 20))
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    log "stopped etcd $pid"
    rm -f "$PIDFILE" "$STATE/users"
    if [ "$KEEP_DATA" != 1 ]; then
        rm -rf "$STATE/data"
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status)
        if answers; then echo "etcd answers on 127.0.0.1:$PORT"; else
            echo "nothing answers on 127.0.0.1:$PORT"
            exit 1
        fi
        ;;
    *)
        echo "usage: $0 start|stop|status" >&2
        exit 2
        ;;
esac
