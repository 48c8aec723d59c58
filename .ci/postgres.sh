#!/usr/bin/env bash
# A throw-away PostgreSQL server for the tests, on 127.0.0.1 (plus one address if asked).
#   bash .ci/postgres.sh start DIR PORT   -> initdb in DIR, start, create database "slotsweep"
#   bash .ci/postgres.sh start DIR PORT ADDR/PREFIX
#                                         -> the same, also listening on ADDR and trusting
#                                            clients from its subnet (the test Slurm nodes)
#   bash .ci/postgres.sh stop DIR         -> stop the server by the PID in DIR/data/postmaster.pid
#   bash .ci/postgres.sh restart DIR      -> start a stopped server again with its last options
# Installs Debian's postgresql when the server binaries are missing. The server runs
# as the unprivileged "postgres" user (PostgreSQL refuses to run as root).
set -euo pipefail
action=$1
dir=$2

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [[ -z "$bindir" || ! -x "$bindir/initdb" ]]; then
  if [[ "$action" == "stop" ]]; then exit 0; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq postgresql >/dev/null
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi

as_postgres() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$action" in
  start)
    port=$3
    extra=${4:-}
    listen=127.0.0.1
    mkdir -p "$dir"
    if [[ $(id -u) -eq 0 ]]; then chown postgres "$dir"; fi
    as_postgres "$bindir/initdb" -D "$dir/data" -U slotsweep --auth=trust -E UTF8 >/dev/null
    if [[ -n "$extra" ]]; then
      # ADDR/PREFIX -> listen on ADDR too; trust the subnet's network address/PREFIX only.
      addr=${extra%/*}
      bits=${extra#*/}
      IFS=. read -r a b c d <<<"$addr"
      n=$(((a << 24) | (b << 16) | (c << 8) | d))
      n=$((n & ((0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF)))
      net="$((n >> 24 & 255)).$((n >> 16 & 255)).$((n >> 8 & 255)).$((n & 255))/$bits"
      listen="127.0.0.1,$addr"
      echo "host all all $net trust" >>"$dir/data/pg_hba.conf"
    fi
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-c listen_addresses=$listen -p $port -k $dir -c fsync=off -c max_connections=200" start >/dev/null
    as_postgres "$bindir/createdb" -h 127.0.0.1 -p "$port" -U slotsweep slotsweep
    head -n 1 "$dir/data/postmaster.pid"
    ;;
  stop)
    if [[ -f "$dir/data/postmaster.pid" ]]; then
      pid=$(head -n 1 "$dir/data/postmaster.pid")
      kill -INT "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    ;;
  restart)
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 restart >/dev/null
    ;;
  *)
    echo "usage: postgres.sh start DIR PORT [ADDR/PREFIX] | stop DIR | restart DIR" >&2
    exit 2
    ;;
esac
