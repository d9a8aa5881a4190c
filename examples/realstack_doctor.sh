#!/usr/bin/env bash
# Real-stack check (a script, not CI): `toolproxy doctor` and a `--runs 3` conformance against the
# real llama.cpp llama-server with Qwen2.5-Coder-0.5B, once as launched by default (--jinja) and
# once with --no-jinja (which refuses tools with HTTP 500). Starts and stops llama-server itself.
#
# Needs a real llama-server and its models in ${TOOLPROXY_REALSTACK:-~/.cache/toolproxy-realstack}
# (docs/stacks.md#a-real-llamacpp-for-the-real-stack-scripts) and `toolproxy` on PATH (or TOOLPROXY=...).
# Usage: examples/realstack_doctor.sh [OUTPUT_DIR]     (default: a new temporary directory)
# Env: RUNS (default 3), MAX_TOKENS per reply (default 96: calls fit; keeps a CPU run short), TOOLPROXY.
set -uo pipefail
DIR=${TOOLPROXY_REALSTACK:-$HOME/.cache/toolproxy-realstack}
BIN=$DIR/bin/llama-server
MODEL_FILE=$DIR/models/qwen2.5-coder-0.5b.gguf
MODEL=qwen2.5-coder-0.5b
TOOLPROXY=${TOOLPROXY:-toolproxy}
OUT=${1:-$(mktemp -d -t toolproxy-realstack.XXXXXX)}
RUNS=${RUNS:-3}
mkdir -p "$OUT"

for f in "$BIN" "$MODEL_FILE"; do
  [ -e "$f" ] || { echo "missing $f: see docs/stacks.md#a-real-llamacpp-for-the-real-stack-scripts" >&2; exit 2; }
done

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

PID=""
stop_server() {
  if [ -n "$PID" ]; then
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=""
  fi
}
trap stop_server EXIT

start_server() {  # start_server LOG [extra llama-server flags...]
  local log=$1; shift
  PORT=$(free_port)
  LD_LIBRARY_PATH="$DIR/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$BIN" -m "$MODEL_FILE" --alias "$MODEL" --host 127.0.0.1 --port "$PORT" -c 4096 -t 2 "$@" >"$log" 2>&1 &
  PID=$!
  for _ in $(seq 1 240); do
    if curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$PID" 2>/dev/null; then echo "llama-server exited; see $log" >&2; tail -5 "$log" >&2; return 1; fi
    sleep 0.5
  done
  echo "llama-server did not become healthy in 120s; see $log" >&2
  return 1
}

status=0
for variant in default no-jinja; do
  flags=()
  [ "$variant" = no-jinja ] && flags=(--no-jinja)
  echo "================ llama-server ($variant${flags:+: ${flags[*]}}) ================"
  start_server "$OUT/llama-server-$variant.log" "${flags[@]}" || { status=2; continue; }
  echo "\$ toolproxy doctor --upstream http://127.0.0.1:$PORT --model $MODEL"
  "$TOOLPROXY" doctor --upstream "http://127.0.0.1:$PORT" --model "$MODEL" --data "$OUT/data"
  echo "(doctor exit status $?)"
  echo
  echo "\$ toolproxy conformance --upstream http://127.0.0.1:$PORT --model $MODEL --runs $RUNS --conditions native,hint,text,constrained"
  "$TOOLPROXY" conformance --upstream "http://127.0.0.1:$PORT" --model "$MODEL" --runs "$RUNS" \
    --conditions native,hint,text,constrained --max-tokens "${MAX_TOKENS:-96}" --concurrency 2 --data "$OUT/data" \
    -o "$OUT/conformance-$variant.md" --quiet
  echo "(conformance exit status $?)"
  stop_server
  echo
done
echo "records: $OUT/data   reports: $OUT/conformance-*.md   server logs: $OUT/llama-server-*.log"
exit $status
