# shellcheck shell=bash
# scripts/lib/bench.sh — helpers the benchmark scripts share (sourced, not run, from the
# repository's root; the guest scripts get them with `declare -f`). Sizes and iteration counts
# come from `rdmx-bench sizes` and `rdmx-bench iters`, figures of the tools' outputs from
# `rdmx-bench figure`, never from copies of their rules here.

scripts/setup >/dev/null
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
rbench=$PWD/target/release/rdmx-bench

# need PACKAGE:COMMAND...: installs (apt) the packages whose command is missing.
need() {
  local missing=() p sudo=
  for p in "$@"; do command -v "${p#*:}" >/dev/null || missing+=("${p%%:*}"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "bench: installing ${missing[*]}" >&2
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
# The commit measured, " (modified)" when the tree has changes.
rdmx_rev() { echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (modified)')"; }

# The median of the numbers on stdin, one per line ("nan" when there are none).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)] }'; }
# The lowest of the numbers on stdin ("nan" when there are none).
lowest() { sort -g | awk 'NR == 1 { v = $1 } END { if (NR == 0) print "nan"; else print v }'; }
# A / B to two decimals, "–" when either is missing or B is zero.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0 || a == "nan" || b == "nan") print "–"; else printf "%.2f", a / b }'; }
# figure WHICH FILE [--size S]: one number of a tool's output (see `rdmx-bench figure --help`);
# nothing when it holds none (rdmx-bench says on stderr when FILE cannot be read).
figure() { "$rbench" figure "$@" || true; }
# FIELD=VALUE from the last `RESULT` line of pingpong --result output in FILE.
result() { sed -n "s/^RESULT .*\b$1=\([^ ]*\).*/\1/p" "$2" 2>/dev/null | tail -1; }

# Whether something listens on PORT: a TCP listener (ucx_perftest, qperf, the rdmx tools over
# TCP) or an rdma_cm ID (perftest -R, rdmx over RDMA).
listening() {
  ss -Hltn "sport = :$1" | grep -q . ||
    { command -v rdma >/dev/null && rdma resource show cm_id 2>/dev/null | grep 'state LISTEN' | grep -qE "src-addr [^ ]*:$1( |$)"; }
}

# serve LOG PORT|- COMMAND...: starts the server COMMAND in the background, its output in LOG,
# and returns once it listens: with "-", once LOG has its `listening on` line (pingpong,
# rdmx-bench socket-pingpong); with a PORT, once a listener is on it (see listening). Sets
# server_pid. Fails with a message when the server exits first or 60 s pass.
serve() {
  local log=$1 port=$2 end=$((SECONDS + 60))
  shift 2
  : > "$log"
  "$@" > "$log" 2>&1 &
  server_pid=$!
  until if [ "$port" = - ]; then grep -q 'listening on' "$log"; else listening "$port"; fi; do
    if ! kill -0 "$server_pid" 2>/dev/null || [ $SECONDS -ge $end ]; then
      echo "bench: server $* exited or did not listen within 60 s: $(tail -1 "$log")" >&2
      kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null
      return 1
    fi
    sleep 0.05 # the polling interval, not a guess at start-up time
  done
}

# pair OUT PORT|- SERVER... -- CLIENT...: serves SERVER (see serve; its log is OUT.server),
# runs CLIENT with its output in OUT (stdout and stderr; for OUT *.json stderr goes to
# OUT.err), then waits for the server. Up to $attempts tries (default 1: the guests set 3,
# for rxe's occasional refusals); fails when the last one does.
pair() {
  local outf=$1 port=$2 server=() try rc
  shift 2
  while [ "$1" != -- ]; do server+=("$1"); shift; done
  shift
  for try in $(seq "${attempts:-1}"); do
    serve "$outf.server" "$port" "${server[@]}" || continue
    rc=0
    case $outf in
      *.json) "$@" > "$outf" 2> "$outf.err" || rc=$? ;;
      *) "$@" > "$outf" 2>&1 || rc=$? ;;
    esac
    if [ $rc = 0 ]; then
      wait "$server_pid" 2>/dev/null
      return 0
    fi
    kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null
    echo "bench: $(program "$@") failed (attempt $try, $(exit_status $rc)): $(tail -qn 1 "$outf.err" "$outf" 2>/dev/null | tail -n 1)" >&2
    # (The next attempt writes over OUT and OUT.err: the failed one's are kept beside them.)
    cp "$outf" "$outf.attempt$try" 2>/dev/null
    cp "$outf.err" "$outf.err.attempt$try" 2>/dev/null
    if [ "$rc" -gt 128 ]; then
      # Killed by a signal: the kernel's line on it names the faulting library, where this
      # machine lets us read the kernel log (the guests do).
      dmesg 2>/dev/null | grep -E 'segfault|general protection|trap' | tail -2 | sed 's/^/bench:   kernel: /' >&2
    fi
  done
  return 1
}

# The program a command line runs, past `timeout DURATION`, `env` and NAME=value words.
program() {
  while [ $# -gt 0 ]; do
    case $1 in
      timeout) shift 2 ;;
      env | *=*) shift ;;
      *) basename "$1"; return ;;
    esac
  done
}

# What exit status RC says: a code, or the signal that killed the command (through
# `timeout`, which dies of its command's signal).
exit_status() {
  if [ "$1" -gt 128 ]; then
    echo "killed by signal $(($1 - 128))$(kill -l $(($1 - 128)) 2>/dev/null | sed 's/^/ SIG/')"
  else
    echo "exit status $1"
  fi
}
