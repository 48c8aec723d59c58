#!/usr/bin/env bash
# A throw-away PostgreSQL server for the tests, on 127.0.0.1 only.
#   bash .ci/postgres.sh start DIR PORT   -> initdb in DIR, start, create database "slotsweep"
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
    mkdir -p "$dir"
    if [[ $(id -u) -eq 0 ]]; then chown postgres "$dir"; fi
    as_postgres "$bindir/initdb" -D "$dir/data" -U slotsweep --auth=trust -E UTF8 >/dev/null
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >/dev/null
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
    echo "usage: postgres.sh start DIR PORT | stop DIR | restart DIR" >&2
    exit 2
    ;;
esac
