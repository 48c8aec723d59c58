#!/usr/bin/env bash
# A throw-away S3-compatible server for the tests: moto's server mode (moto[server],
# installed by `bash .ci/setup --dev`), its buckets in memory.
#   bash .ci/s3.sh start DIR PORT [ADDR] -> serve on 127.0.0.1 (on ADDR instead when given:
#                                           the test Slurm nodes reach the host's bridge
#                                           address); writes DIR/moto.pid, prints the PID
#                                           once the server answers
#   bash .ci/s3.sh stop DIR              -> stop the server by the PID in DIR/moto.pid
# PYTHON names the interpreter that has moto (default: .venv's, else python3).
set -euo pipefail
action=$1
dir=$2
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/${SLOTSWEEP_VENV:-.venv}/bin/python}
if [[ ! -x "$python" ]]; then python=python3; fi

case "$action" in
  start)
    port=$3
    addr=${4:-127.0.0.1}
    mkdir -p "$dir"
    "$python" -m moto.server -H "$addr" -p "$port" >"$dir/moto.log" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/moto.pid"
    for _ in $(seq 1 200); do
      if "$python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "http://$addr:$port/moto-api/" 2>/dev/null; then
        echo "$pid"
        exit 0
      fi
      if ! kill -0 "$pid" 2>/dev/null; then break; fi
      sleep 0.2
    done
    echo "s3.sh: moto_server did not answer on $addr:$port:" >&2
    tail -n 20 "$dir/moto.log" >&2
    kill "$pid" 2>/dev/null || true
    exit 1
    ;;
  stop)
    if [[ -f "$dir/moto.pid" ]]; then
      pid=$(cat "$dir/moto.pid")
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
      rm -f "$dir/moto.pid"
    fi
    ;;
  *)
    echo "usage: bash .ci/s3.sh start DIR PORT [ADDR] | stop DIR" >&2
    exit 2
    ;;
esac
