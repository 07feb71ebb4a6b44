#!/usr/bin/env bash
# Stop signals through mpirun, as users send them, for one family: each way ends with one stop
# snapshot that validates, every rank stopping on the signal with exit code 4, and the launcher's
# exit code as documented (docs/clusters.md, "Signals, by launcher").
#
#   tests/signals/launcher_signals.sh nerf|gaussians|diffusion BUILD_DIR
#
# Cases, each a 2-rank `mpiexec` run of the family's demo config, made small:
#   ctrl_c     Ctrl-C mid-training: SIGINT to mpiexec's process group, as a terminal sends it
#              (mpiexec exits 1, its own code; the ranks 4)
#   timeout    (nerf) `timeout --foreground -s TERM N mpiexec ...` expiring mid-training (124)
#   timeout_usr1  (nerf) `timeout -s USR1 N mpiexec ...` expiring mid-training (124)
#   startup    `kill -USR1 <mpiexec>` while the ranks are starting (run lock taken, no step yet)
#   resume     the same while a run is resuming from that stop snapshot (--resume auto)
#   snapshot   (nerf, whose snapshots take long enough to catch) the same while a snapshot is
#              being written
# mpiexec gets `--mca odls_base_sigkill_timeout 3` (launch/ scripts give it 10): with Open MPI's
# default of 1 s its SIGKILL follows SIGTERM too soon for a snapshot (docs/clusters.md).
set -euo pipefail
family=${1:?usage: launcher_signals.sh nerf|gaussians|diffusion BUILD_DIR}
build=$(cd "${2:?usage: launcher_signals.sh FAMILY BUILD_DIR}" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tessera="$build/tessera"
mpiexec=${TESSERA_MPIEXEC:-mpiexec}
work="$build/signal-tests/$family"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$work"
mkdir -p "$work"

fail() { echo "FAIL ($family, ${case_name:-setup}): $*" >&2; exit 1; }
say() { echo "[$family ${case_name:-setup}] $*"; }

# The job of the case in flight, if any: a failing case leaves no process of its own behind.
job=""
trap 'if [ -n "$job" ]; then kill -KILL -- "-$job" 2>/dev/null || true; fi' EXIT
trap 'echo "FAIL ($family, ${case_name:-setup}): line $LINENO: $BASH_COMMAND" >&2' ERR

case "$family" in
  nerf)
    "$tessera" synth --preset objects --views 8 --width 32 --height 24 --out "$work/data.h5" >/dev/null 2>&1
    config=configs/demo_nerf.toml
    args=(--set train.log_every=1 --set nerf.rays_per_step=512 --set eval.max_views=1) ;;
  gaussians)
    "$tessera" synth --preset objects --views 8 --width 32 --height 24 --out "$work/data.h5" >/dev/null 2>&1
    config=configs/demo_gaussians.toml
    args=(--set train.log_every=1 --set eval.max_views=1) ;;
  diffusion)
    "$tessera" synth --preset shapes --count 40 --points 256 --out "$work/data.h5" >/dev/null 2>&1
    config=configs/demo_diffusion.toml
    args=(--set train.log_every=1 --set diffusion.batch=8 --set diffusion.tokens=64
          --set eval.max_views=4) ;;
  *) echo "launcher_signals.sh: unknown family '$family'" >&2; exit 2 ;;
esac
args+=(--set "data.path=$work/data.h5" --set train.steps=100000 --set snapshot.every=0
       --set eval.every=0 --set distributed.threads=1)

# start RUN_DIR [PREFIX...] [-- TRAIN ARGS...]: mpiexec of the family's run in its own process
# group (as a terminal's foreground job), output to RUN_DIR.out; sets job (the group's id).
start() {
  local dir=$1 prefix=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do prefix+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  setsid "${prefix[@]}" "$mpiexec" -n 2 --oversubscribe --mca odls_base_sigkill_timeout 3 \
    "$tessera" train "$root/$config" --set "run.out_dir=$dir" "${args[@]}" "$@" \
    > "$dir.out" 2>&1 &
  job=$!
}
# finish: waits for the job (bounded: 120 s); sets rc to its exit code.
finish() {
  local waited=0
  while kill -0 "$job" 2>/dev/null && [ "$waited" -lt 1200 ]; do sleep 0.1; waited=$((waited + 1)); done
  kill -0 "$job" 2>/dev/null && fail "the job still runs 120 s after the signal"
  rc=0
  wait "$job" || rc=$?
  job=""
}
# until_true SECONDS COMMAND...: polls COMMAND every 0.05 s (bounded).
until_true() {
  local limit=$(( $1 * 20 )) n=0
  shift
  until "$@"; do
    n=$((n + 1))
    [ "$n" -lt "$limit" ] || return 1
    sleep 0.05
  done
}
training() { [ -s "$1/metrics.jsonl" ]; }
# starting RUN_DIR: rank 0 holds the run lock (the ranks are up, signals handled), no step yet
# of this job (its pid is the lock's, not that of the job before).
starting() { [ -f "$1/run.lock" ] && grep -q "pid" "$1/run.lock" && ! grep -q "pid $2 " "$1/run.lock"; }
writing() { compgen -G "$1/snapshots/step-*.h5.tmp" >/dev/null; }
mpiexec_pid() { pgrep -g "$job" -x "$(basename "$mpiexec")" | head -1; }
# stopped RUN_DIR SNAPSHOTS_BEFORE SIGNAL: every rank stopped on SIGNAL (its log), rank 0 said so,
# at most one more snapshot (none when the stop came where one was already due), all valid, no
# temporary left.
stopped() {
  local dir=$1 before=$2 signal=$3 after newest log
  grep -q "stopped by a signal after step" "$dir.out" || fail "no stop message: $(tail -5 "$dir.out")"
  for log in "$dir"/logs/rank-0.log "$dir"/logs/rank-1.log; do
    grep -q "stopped by signal $signal after step" "$log" || fail "$(basename "$log"): no stop on signal $signal"
  done
  after=$(ls "$dir"/snapshots/step-*.h5 2>/dev/null | wc -l)
  [ "$after" -ge 1 ] && [ "$after" -le $((before + 1)) ] || fail "$after snapshot(s) after the stop, $before before"
  ! writing "$dir" || fail "a temporary snapshot was left behind"
  newest=$(ls "$dir"/snapshots/step-*.h5 | tail -1)
  "$tessera" info "$newest" >/dev/null || fail "the stop snapshot $newest does not validate"
  say "${SECONDS} s: exit code $rc, $(grep -o 'stopped by a signal after step [0-9]*' "$dir.out" | head -1), $(basename "$newest") validates"
}

# Ctrl-C and SIGTERM reach mpiexec, not the ranks (Open MPI starts them in their own process
# groups); it forwards SIGTERM after odls_base_sigkill_timeout and then exits with its own code,
# 1, whatever the ranks' (docs/clusters.md). kill -USR1 is forwarded at once, and mpiexec then
# exits with the ranks' code: 4.
case_name=ctrl_c
started=$SECONDS
start "$work/ctrl_c"
until_true 120 training "$work/ctrl_c" || fail "no training within 120 s: $(tail -5 "$work/ctrl_c.out")"
# The timeout cases fire this long after their start: mid-training here (sanitizer builds start
# slower).
limit=$(( SECONDS - started + 4 ))
kill -INT -- "-$job"
finish
[ "$rc" = 1 ] || fail "mpiexec's exit code after Ctrl-C is $rc, expected 1"
stopped "$work/ctrl_c" 0 15

# timeout signals the command and then its process group, so mpiexec would get SIGTERM twice,
# and Open MPI takes a second one as "kill now": the stop snapshot is lost. --foreground sends
# it once; `timeout -s USR1` is forwarded at once (docs/clusters.md).
if [ "$family" = nerf ]; then  # how a launcher passes a signal on does not depend on the family
case_name=timeout
start "$work/timeout" timeout --foreground -s TERM "$limit"
finish
[ "$rc" = 124 ] || fail "timeout did not expire (exit code $rc): $(tail -5 "$work/timeout.out")"
[ -s "$work/timeout/metrics.jsonl" ] || fail "timeout expired before training (after $limit s)"
stopped "$work/timeout" 0 15

case_name=timeout_usr1
start "$work/timeout_usr1" timeout -s USR1 "$limit"
finish
[ "$rc" = 124 ] || fail "timeout did not expire (exit code $rc): $(tail -5 "$work/timeout_usr1.out")"
[ -s "$work/timeout_usr1/metrics.jsonl" ] || fail "timeout expired before training (after $limit s)"
stopped "$work/timeout_usr1" 0 10
fi

case_name=startup
start "$work/startup"
until_true 120 starting "$work/startup" none || fail "the ranks did not start within 120 s"
kill -USR1 "$(mpiexec_pid)"
finish
[ "$rc" = 4 ] || fail "exit code $rc, expected 4: $(tail -5 "$work/startup.out")"
stopped "$work/startup" 0 10

case_name=resume
before=$(ls "$work"/startup/snapshots/step-*.h5 | wc -l)
old_pid=$(sed -n 's/.* pid \([0-9]*\) .*/\1/p' "$work/startup/run.lock")
mv "$work/startup.out" "$work/startup-first.out"
start "$work/startup" -- --resume auto
until_true 120 starting "$work/startup" "$old_pid" || fail "the resumed ranks did not start within 120 s"
kill -USR1 "$(mpiexec_pid)"
finish
[ "$rc" = 4 ] || fail "exit code $rc, expected 4: $(tail -5 "$work/startup.out")"
grep -q "^resuming from" "$work/startup.out" || fail "the run did not resume: $(tail -5 "$work/startup.out")"
stopped "$work/startup" "$before" 10

if [ "$family" = nerf ]; then
  # Signalled as soon as a temporary snapshot file appears (writes take tens of milliseconds
  # here, so the signal may also land just after one).
  case_name=snapshot
  start "$work/snapshot" -- --set snapshot.every=3
  until_true 120 writing "$work/snapshot" || fail "no snapshot write seen within 120 s"
  kill -USR1 "$(mpiexec_pid)"
  before=$( (ls "$work"/snapshot/snapshots/step-*.h5 2>/dev/null || true) | wc -l)
  finish
  [ "$rc" = 4 ] || fail "exit code $rc, expected 4: $(tail -5 "$work/snapshot.out")"
  stopped "$work/snapshot" "$((before + 1))" 10
fi
say "passed"
