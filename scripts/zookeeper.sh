#!/usr/bin/env bash
# A throwaway standalone ZooKeeper for tests, from Debian's `zookeeper` package.
#
#   scripts/zookeeper.sh start    # install if absent, start on 127.0.0.1:2181, wait until it answers
#   scripts/zookeeper.sh stop     # stop what `start` started (nothing if it started nothing)
#   scripts/zookeeper.sh status   # does something answer on the port?
#
# `start` does nothing when something already answers on the port (a developer's own
# server, or CI's service), and then records nothing, so `stop` stops nothing: it only
# ever stops the process whose pid `start` wrote. Test runs sharing a machine may nest:
# a `start` that finds our own server already up counts one more user, and `stop` only
# stops it when the last user stops. Pair each `start` with one `stop` (scripts/test
# does so in a trap).
#
# The server gets its own config and a fresh data dir under $MULTILOCK_ZK_DIR (default:
# a directory in $TMPDIR), listens on loopback only, has the admin server disabled and
# whitelists the four-letter words used here and by the tests. MULTILOCK_ZK_PORT picks
# another port; MULTILOCK_ZK_KEEP_DATA=1 keeps the data across stop/start (fault tests
# restart a private server with its sessions). A short
# tickTime lets tests ask for session timeouts down to 2 x tickTime = 400 ms;
# maxSessionTimeout is raised so multilock's 10 s default is not clamped.
#
# TLS (a private server of the TLS tests): MULTILOCK_ZK_TLS_DIR names a directory made by
# scripts/test-ca; the server then listens on the port with TLS only (Netty,
# secureClientPort), presents $MULTILOCK_ZK_TLS_DIR/${MULTILOCK_ZK_TLS_CERT:-server}.pem,
# and asks clients for a certificate signed by its ca.crt per MULTILOCK_ZK_TLS_CLIENT_AUTH
# (need, want or none; default need).
#
# An ensemble member (the topology tests' 3-node ensemble): MULTILOCK_ZK_ENSEMBLE lists
# every member as `id=host:quorumport:electionport` (space-separated) and MULTILOCK_ZK_MYID
# names this one; each member has its own MULTILOCK_ZK_DIR and MULTILOCK_ZK_PORT. `start`
# returns once the member answers ruok, which it does before the ensemble has a quorum:
# wait for `srvr` to show a Mode. MULTILOCK_ZK_ADDR is the address clients connect to
# (default 127.0.0.1; a test's veth address in the partition tests).
set -euo pipefail

PORT="${MULTILOCK_ZK_PORT:-2181}"
ADDR="${MULTILOCK_ZK_ADDR:-127.0.0.1}"
ENSEMBLE="${MULTILOCK_ZK_ENSEMBLE:-}"
MYID="${MULTILOCK_ZK_MYID:-}"
STATE="${MULTILOCK_ZK_DIR:-${TMPDIR:-/tmp}/multilock-zookeeper-$(id -u)}"
PIDFILE="$STATE/zookeeper.pid"
JAR=/usr/share/java/zookeeper.jar
WAIT_SECONDS="${MULTILOCK_ZK_WAIT:-60}"
KEEP_DATA="${MULTILOCK_ZK_KEEP_DATA:-0}" # 1: restart on the same data (fault tests)
TLS_DIR="${MULTILOCK_ZK_TLS_DIR:-}"
TLS_CERT="${MULTILOCK_ZK_TLS_CERT:-server}"
TLS_CLIENT_AUTH="${MULTILOCK_ZK_TLS_CLIENT_AUTH:-need}"

log() { echo "zookeeper.sh: $*" >&2; }

# ruok over bash's /dev/tcp, in a subshell: no netcat needed on a fresh machine, and a
# refused connection neither prints nor leaks a descriptor. Over TLS: openssl s_client,
# with the test CA's client certificate.
answers() {
    local reply
    if [ -n "$TLS_DIR" ]; then
        reply="$(printf 'ruok' | timeout 5 openssl s_client -quiet \
            -connect "$ADDR:$PORT" -CAfile "$TLS_DIR/ca.crt" \
            -cert "$TLS_DIR/client.crt" -key "$TLS_DIR/client.key" 2>/dev/null)" || return 1
        [ "$reply" = "imok" ]
        return
    fi
    reply="$( (
        exec 3<>"/dev/tcp/$ADDR/$PORT" || exit 1
        printf 'ruok' >&3
        read -r -t 2 line <&3 || true
        printf '%s' "${line:-}"
    ) 2>/dev/null)" || return 1
    [ "$reply" = "imok" ]
}

listening() {
    # Something accepts connections even if it refuses ruok (4lw not whitelisted).
    (exec 3<>"/dev/tcp/$ADDR/$PORT") 2>/dev/null
}

install_zookeeper() {
    if [ -r "$JAR" ] && command -v java >/dev/null 2>&1; then
        return 0
    fi
    log "installing Debian's zookeeper package"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq zookeeper >/dev/null
}

write_config() {
    mkdir -p "$STATE"
    if [ "$KEEP_DATA" != 1 ]; then
        rm -rf "$STATE/data"
    fi
    mkdir -p "$STATE/data"
    cat >"$STATE/zoo.cfg" <<EOF
tickTime=200
minSessionTimeout=400
maxSessionTimeout=60000
dataDir=$STATE/data
$(listen_config)
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,conf,mntr,cons
$(ensemble_config)
EOF
    cat >"$STATE/log4j.properties" <<EOF
log4j.rootLogger=WARN, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File=$STATE/zookeeper.log
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1}: %m%n
EOF
}

# Standalone, or a member of MULTILOCK_ZK_ENSEMBLE (its myid in the data dir). Short
# limits, in ticks of 200 ms: a follower syncs within 2 s and is dropped after 1 s of
# silence, so that a killed leader is replaced within about a second.
ensemble_config() {
    if [ -z "$ENSEMBLE" ]; then
        echo "standaloneEnabled=true"
        return
    fi
    echo "$MYID" >"$STATE/data/myid"
    printf 'standaloneEnabled=false\ninitLimit=10\nsyncLimit=5\n'
    local member
    for member in $ENSEMBLE; do
        echo "server.${member%%=*}=${member#*=}"
    done
}

# Where clients connect: the plain port, or (MULTILOCK_ZK_TLS_DIR) the TLS one only.
listen_config() {
    if [ -z "$TLS_DIR" ]; then
        printf 'clientPort=%s\nclientPortAddress=%s\n' "$PORT" "$ADDR"
        return
    fi
    cat <<EOF
secureClientPort=$PORT
secureClientPortAddress=$ADDR
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
ssl.keyStore.location=$TLS_DIR/$TLS_CERT.pem
ssl.keyStore.type=PEM
ssl.trustStore.location=$TLS_DIR/ca.crt
ssl.trustStore.type=PEM
ssl.clientAuth=$TLS_CLIENT_AUTH
EOF
}

# One `start`/`stop` at a time (several test runs may share the machine).
serialize() {
    mkdir -p "$STATE"
    exec 9>"$STATE/lock"
    flock 9
}

# The pid `start` recorded, if that process still runs our config.
our_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 1
    pid="$(cat "$PIDFILE")"
    kill -0 "$pid" 2>/dev/null && grep -qF "$STATE/zoo.cfg" "/proc/$pid/cmdline" 2>/dev/null || return 1
    echo "$pid"
}

users() { cat "$STATE/users" 2>/dev/null || echo 0; }

start() {
    serialize
    if listening; then
        if our_pid >/dev/null; then
            # Ours, started by an earlier `start` still in use: count one more user,
            # so that this caller's `stop` leaves it to the others.
            echo $(($(users) + 1)) >"$STATE/users"
            log "our ZooKeeper already answers on $ADDR:$PORT ($(users) users)"
        else
            log "something already listens on $ADDR:$PORT; using it, starting nothing"
        fi
        return 0
    fi
    if [ -n "$ENSEMBLE" ] && [ -z "$MYID" ]; then
        log "MULTILOCK_ZK_ENSEMBLE needs MULTILOCK_ZK_MYID"
        return 2
    fi
    install_zookeeper
    write_config
    local classpath="$JAR:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"
    # Netty (the TLS server) needs these beside the jars zookeeper.jar's manifest lists.
    local jar
    for jar in netty-codec netty-resolver netty-transport-native-unix-common; do
        classpath="$classpath:/usr/share/java/$jar.jar"
    done
    # A member of an ensemble runs the quorum peer; a standalone server the plain one.
    local main=org.apache.zookeeper.server.ZooKeeperServerMain
    if [ -n "$ENSEMBLE" ]; then
        main=org.apache.zookeeper.server.quorum.QuorumPeerMain
    fi
    # setsid: the server outlives this script but not a `stop`; no JMX, small heap.
    setsid java -Xms64m -Xmx256m -XX:+UseSerialGC \
        -Dlog4j.configuration="file:$STATE/log4j.properties" \
        -Dzookeeper.jmx.log4j.disable=true \
        -cp "$classpath" "$main" "$STATE/zoo.cfg" \
        >"$STATE/stdout.log" 2>&1 </dev/null 9>&- &
    local pid=$!
    echo "$pid" >"$PIDFILE"
    echo 1 >"$STATE/users"
    local deadline=$((SECONDS + WAIT_SECONDS))
    while ! answers; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "ZooKeeper exited during startup; its output:"
            cat "$STATE/stdout.log" "$STATE/zookeeper.log" >&2 2>/dev/null || true
            rm -f "$PIDFILE" "$STATE/users"
            return 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "ZooKeeper did not answer ruok within ${WAIT_SECONDS}s; stopping it"
            kill_server "$pid"
            return 1
        fi
        sleep 0.2
    done
    log "ZooKeeper $pid answers on $ADDR:$PORT (state in $STATE)"
}

stop() {
    serialize
    local pid
    if ! pid="$(our_pid)"; then
        rm -f "$PIDFILE" "$STATE/users"  # nothing of ours runs (never started, or it died)
        return 0
    fi
    local left=$(($(users) - 1))
    if [ "$left" -gt 0 ]; then
        echo "$left" >"$STATE/users"
        log "ZooKeeper $pid stays up for $left other user(s)"
        return 0
    fi
    kill_server "$pid"
}

kill_server() {
    local pid="$1"
    kill "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 20))
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    log "stopped ZooKeeper $pid"
    rm -f "$PIDFILE" "$STATE/users"
    if [ "$KEEP_DATA" != 1 ]; then
        rm -rf "$STATE/data"
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status)
        if answers; then echo "imok on $ADDR:$PORT"; else echo "nothing answers on $ADDR:$PORT"; exit 1; fi
        ;;
    *)
        echo "usage: $0 start|stop|status" >&2
        exit 2
        ;;
esac
