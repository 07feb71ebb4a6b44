#!/usr/bin/env bash
# The `cluster` tests: Tessera as a cluster user runs it, on the Slurm cluster that
# launch/cluster builds on this machine (docs/clusters.md). `launch/test --cluster` brings the
# cluster up, runs them (ctest -L cluster) and takes it down; without a cluster they skip.
#
#   tests/cluster/cluster_test.sh CASE BUILD_DIR
#
# Cases (each fails on a wrong result, not only on a crash):
#   sbatch       launch/slurm.sbatch as written (srun --mpi=pmix), 2 nodes x 2 ranks, the demo
#                NeRF and 3DGS configs shortened: every rank logs its node, local rank and
#                threads; the final parameters equal the same run on one node (4 ranks), bitwise
#   mpirun       mpirun --hostfile across the nodes, started from node 1 (OpenMPI's rsh agent
#                is `launch/cluster exec`, where a real cluster has ssh): the same NeRF result
#   requeue      a job that reaches its time limit: the template's warning, a stop snapshot on
#                every rank, a requeue, --resume auto, until done; bitwise the uninterrupted run
#   signals      scancel --signal=TERM: one snapshot, exit code 4, not requeued
#   two_jobs     a second job on a run directory in use is refused (exit 2); another runs beside
#   lost_node    a node killed mid-run: the job ends within 60 s, its newest snapshot validates,
#                it is requeued and resumes, bitwise the uninterrupted run
#   runpath      a node that does not see the binary's libraries: refused at start, exit 2
#   lost_link    a node's link cut mid-snapshot: every rank ends within 60 s, the newest snapshot
#                validates; requeued onto the one node left (4 ranks -> 2), it resumes and ends
# Work files go to BUILD_DIR/cluster-tests/CASE (a shared directory, as a cluster's home is).
set -euo pipefail
case_name=${1:?usage: cluster_test.sh CASE BUILD_DIR}
build=$(cd "${2:?usage: cluster_test.sh CASE BUILD_DIR}" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cluster="$root/launch/cluster"
tessera="$build/tessera"
work="$build/cluster-tests/$case_name"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }
say() { echo "[$case_name] $*"; }

# Without a cluster the case is skipped (CTest's SKIP_RETURN_CODE), unless launch/test --cluster
# runs it (TESSERA_REQUIRE_CLUSTER=1): then a missing cluster fails.
if ! "$cluster" status >/dev/null 2>&1; then
  if [ "${TESSERA_REQUIRE_CLUSTER:-0}" = 1 ]; then fail "the cluster is not up (launch/cluster up)"; fi
  echo "skipped: no cluster is up (launch/test --cluster, docs/clusters.md)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
cd "$work"

# A small scene (seconds) and the demo configs, shortened.
"$tessera" synth --preset objects --views 8 --width 32 --height 24 --out "$work/scene.h5" >/dev/null 2>&1 ||
  fail "tessera synth failed"
NERF_ARGS=(--set "data.path=$work/scene.h5" --set train.steps=24 --set train.log_every=4
           --set nerf.rays_per_step=512 --set snapshot.every=8 --set eval.max_views=1)
GS_ARGS=(--set "data.path=$work/scene.h5" --set train.steps=24 --set train.log_every=4
         --set gaussians.densify_from=5 --set gaussians.densify_until=20
         --set gaussians.densify_every=5 --set snapshot.every=8 --set eval.every=0
         --set eval.max_views=1)

# job_field JOBID FIELD: a field of `scontrol show job` (JobState, ExitCode, Restarts, ...).
job_field() {
  scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}
# wait_job JOBID SECONDS [release]: until the job has ended (bounded); prints its final state.
# With `release`, a requeued job waiting out Slurm's requeue delay (about 2 minutes,
# Reason=BeginTime) is released 20 s after its requeue (its SubmitTime), to keep the test short:
# sooner, its first step can collide with the old run's step, whose slurmstepd is still cleaning
# up (the PMIx socket of step JOB.0 is still bound).
wait_job() {
  local id=$1 limit=$2 release=${3:-} waited=0 state
  while [ "$waited" -lt "$limit" ]; do
    state=$(job_field "$id" JobState)
    case "$state" in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
        echo "$state"; return 0 ;;
      PENDING)
        if [ "$(job_field "$id" Reason)" = BadConstraints ]; then
          scancel "$id" 2>/dev/null || true
          fail "job $id can never run (Reason=BadConstraints): $(scontrol show job "$id" | grep -i 'NumNodes\|MinCPUs')"
        fi
        if [ -n "$release" ] && [ "$(job_field "$id" Reason)" = BeginTime ] &&
           [ $(( $(date +%s) - $(date -d "$(job_field "$id" SubmitTime)" +%s) )) -ge 20 ]; then
          scontrol update JobId="$id" StartTime=now >/dev/null 2>&1 || true
        fi ;;
    esac
    sleep 2
    waited=$((waited + 2))
  done
  scancel "$id" 2>/dev/null || true
  fail "job $id still ${state:-unknown} after ${limit}s"
}
# The template as a user of CPU-only nodes has it: its GPU line deleted, as its comment says.
grep -q -- "--gpus-per-task=1 .*# delete on CPU-only nodes" "$root/launch/slurm.sbatch" ||
  fail "launch/slurm.sbatch has no GPU line marked 'delete on CPU-only nodes'"
grep -v -- "--gpus-per-task=1 .*# delete on CPU-only nodes" "$root/launch/slurm.sbatch" > "$work/slurm.sbatch"
# submit OUTPUT [SBATCH ARGS...] -- [TRAIN ARGS...]: sbatch of the template, 2 nodes x 2 ranks
# (--overcommit: a node of this cluster has one core; --oversubscribe: jobs may share nodes, so
# that two run side by side); prints the job id.
submit() {
  local out=$1
  shift
  local sb=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sb+=("$1"); shift; done
  shift
  sbatch --parsable --chdir="$work" --output="$out" --nodes=2 --ntasks-per-node=2 --overcommit \
    --oversubscribe --cpus-per-task=1 "${sb[@]}" "$work/slurm.sbatch" "$@" | tee -a "$work/jobs"
}
# A case that fails leaves no job of its own behind and no node lost.
hidden=""  # runpath: a folder hidden on tnode2 by a mount
on_exit() {
  if [ -s "$work/jobs" ]; then scancel $(cat "$work/jobs") 2>/dev/null || true; fi
  case "$case_name" in lost_*) "$cluster" restore tnode2 >/dev/null 2>&1 || true ;; esac
  if [ -n "$hidden" ]; then "$cluster" exec tnode2 umount "$hidden" 2>/dev/null || true; fi
}
trap on_exit EXIT
# wait_for FILE_GLOB SECONDS: until a file matching it exists (bounded).
wait_for() {
  local waited=0
  while [ "$waited" -lt "$2" ]; do
    compgen -G "$1" >/dev/null && return 0
    sleep 1
    waited=$((waited + 1))
  done
  fail "no $1 after $2 s"
}
# ranks_on NODE: how many tessera processes run in the node's network namespace (the nodes share
# this machine's PID namespace, so pgrep alone would see every node's).
ranks_on() {
  local pid count=0
  for pid in $(ip netns pids "$1" 2>/dev/null); do
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = tessera ]; then count=$((count + 1)); fi
  done
  echo "$count"
}
# training JOBID RUN_DIR SECONDS: until the job's run has logged a step (bounded).
training() {
  local waited=0
  while [ "$waited" -lt "$3" ]; do
    [ -s "$2/metrics.jsonl" ] && return 0
    [ -n "$(job_field "$1" JobState | grep -v 'PENDING\|RUNNING\|CONFIGURING')" ] &&
      fail "job $1 ended before training: $(job_field "$1" JobState)"
    sleep 1
    waited=$((waited + 1))
  done
  fail "job $1 did not start training within $3 s"
}
# snapshotting_job: the NeRF demo for $steps steps with a snapshot every 25, submitted; returns
# once its first snapshot is on disk. Sets id and args.
snapshotting_job() {
  args=("${NERF_ARGS[@]}" --set train.steps="$steps" --set snapshot.every=25)
  id=$(CONFIG="$root/configs/demo_nerf.toml" TESSERA="$tessera" submit "$work/job.out" -- \
       --set "run.out_dir=$work/run" "${args[@]}")
  training "$id" "$work/run" 300
  wait_for "$work/run/snapshots/step-*.h5" 120
}
newest_snapshot() { ls "$1"/snapshots/step-*.h5 2>/dev/null | tail -1; }
# same_parameters A B: bitwise equal parameters and Adam moments (h5diff exits 0 only then).
same_parameters() {
  h5diff -q "$1" "$2" /params /params && h5diff -q "$1" "$2" /optimizer /optimizer
}
# reference RUN_DIR CONFIG ARGS...: the same run on one node (this host), 4 ranks.
reference() {
  local dir=$1 config=$2
  shift 2
  # shellcheck disable=SC2046
  mpirun -np 4 --oversubscribe --mca odls_base_sigkill_timeout 10 "$tessera" train \
    "$root/$config" --set "run.out_dir=$dir" "$@" > "$dir.out" 2>&1 ||
    fail "the one-node reference run failed: $(tail -5 "$dir.out")"
}
# check_ranks OUTPUT_LOG_DIR: 4 ranks on 2 hosts, local ranks 0 and 1 on each, threads x ranks
# per node within the node's cores (`launch/cluster status` lists them).
check_ranks() {
  local logs=$1 hosts lines
  lines=$(grep -h "tessera train .*: rank [0-9]* of 4, local rank" "$logs"/rank-*.log) ||
    fail "no start lines in $logs"
  hosts=$(sed -n 's/.* on \([^ ]*\) (from.*/\1/p' <<<"$lines" | sort -u | wc -l)
  [ "$hosts" -eq 2 ] || fail "ranks ran on $hosts host(s), expected 2: $lines"
  for host in $(sed -n 's/.* on \([^ ]*\) (from.*/\1/p' <<<"$lines" | sort -u); do
    local mine locals threads cores
    mine=$(grep " on $host (from" <<<"$lines")
    locals=$(sed -n 's/.*local rank \([0-9]*\) of 2 on.*/\1/p' <<<"$mine" | sort | tr '\n' ' ')
    [ "$locals" = "0 1 " ] || fail "local ranks on $host are '$locals', expected 0 1: $mine"
    grep -q "(from SLURM_LOCALID)\|(from OMPI_COMM_WORLD_LOCAL_RANK)" <<<"$mine" ||
      fail "local rank not from the launcher on $host: $mine"
    threads=$(sed -n 's/.*), \([0-9]*\) CPU threads.*/\1/p' <<<"$mine" | awk '{s += $1} END {print s}')
    cores=$("$cluster" status | awk -v h="$host" '$1 == h {print $3}')
    [ -n "$cores" ] || fail "launch/cluster status does not list $host"
    [ "$threads" -le "$(( cores > 2 ? cores : 2 ))" ] ||
      fail "$host runs $threads threads on $cores core(s)"
  done
}

case "$case_name" in
  sbatch)
    # TESSERA_CLUSTER_DEMO=full: the demo configs as they are, on the demo scene (launch/demo's),
    # to their last step (about 25 minutes here) instead of 24 steps of a small scene.
    if [ "${TESSERA_CLUSTER_DEMO:-short}" = full ]; then
      "$tessera" synth --preset objects --out "$work/demo_scene.h5" >/dev/null 2>&1 || fail "synth failed"
      NERF_ARGS=(--set "data.path=$work/demo_scene.h5")
      GS_ARGS=(--set "data.path=$work/demo_scene.h5")
    fi
    for family in nerf gaussians; do
      if [ "$family" = nerf ]; then args=("${NERF_ARGS[@]}"); config=configs/demo_nerf.toml
      else args=("${GS_ARGS[@]}"); config=configs/demo_gaussians.toml; fi
      steps=$(awk '/^\[train\]/ {t = 1} t && /^steps *=/ {print $3; exit}' "$root/$config")
      for arg in "${args[@]}"; do case "$arg" in train.steps=*) steps=${arg#train.steps=} ;; esac; done
      say "$family: sbatch launch/slurm.sbatch, 2 nodes x 2 ranks"
      id=$(CONFIG="$root/$config" TESSERA="$tessera" submit "$work/$family.out" -- \
           --set "run.out_dir=$work/$family" "${args[@]}")
      state=$(wait_job "$id" 3600)
      [ "$state" = COMPLETED ] || fail "$family job $id ended $state: $(tail -20 "$work/$family.out")"
      [ "$(job_field "$id" ExitCode)" = 0:0 ] || fail "$family job exit code $(job_field "$id" ExitCode)"
      check_ranks "$work/$family/logs"
      say "$family: the same run on one node"
      reference "$work/$family-one-node" "$config" "${args[@]}"
      a=$(newest_snapshot "$work/$family")
      b=$(newest_snapshot "$work/$family-one-node")
      [ "$(basename "$a")" = "$(printf 'step-%08d.h5' "$steps")" ] || fail "$family: newest snapshot $a, expected step $steps"
      grep -h '"eval' "$work/$family/metrics.jsonl" | tail -1 | sed "s/^/  $family, 2 nodes: /"
      same_parameters "$a" "$b" || fail "$family: 2 nodes and 1 node differ ($a vs $b)"
      say "$family: 2 nodes x 2 ranks = 1 node x 4 ranks, bitwise"
    done
    ;;
  mpirun)
    say "mpirun --hostfile from node 1, rsh agent launch/cluster exec"
    "$cluster" hostfile --slots 2 > "$work/hostfile"
    first=$(head -1 "$work/hostfile" | cut -d' ' -f1)
    # The agent as an environment variable: `exec` joins its arguments for a shell, as ssh does,
    # which would split a quoted "--mca plm_rsh_agent '...'" value.
    OMPI_MCA_plm_rsh_agent="$cluster exec" "$cluster" exec "$first" mpirun -np 4 \
      --hostfile "$work/hostfile" --mca odls_base_sigkill_timeout 10 \
      -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
      "$tessera" train "$root/configs/demo_nerf.toml" --set "run.out_dir=$work/nerf" \
      "${NERF_ARGS[@]}" > "$work/nerf.out" 2>&1 || fail "mpirun failed: $(tail -20 "$work/nerf.out")"
    check_ranks "$work/nerf/logs"
    reference "$work/nerf-one-node" configs/demo_nerf.toml "${NERF_ARGS[@]}"
    same_parameters "$(newest_snapshot "$work/nerf")" "$(newest_snapshot "$work/nerf-one-node")" ||
      fail "mpirun across nodes and on one node differ"
    say "2 nodes (mpirun --hostfile) = 1 node, bitwise"
    ;;
  requeue)
    # A run that cannot fit its first job: a 2-minute limit warned 30-90 s ahead (Slurm's
    # resolution) stops it after 30 s or more of training, then the script requeues it. The
    # pending job gets a limit long enough to finish.
    steps=1500
    args=("${NERF_ARGS[@]}" --set train.steps=$steps --set snapshot.every=0)
    say "sbatch --time=2 --signal=B:USR1@30: $steps steps cannot fit the first job"
    start=$(date +%s)
    id=$(CONFIG="$root/configs/demo_nerf.toml" TESSERA="$tessera" submit "$work/job.out" \
         --time=2 --signal=B:USR1@30 -- --set "run.out_dir=$work/run" "${args[@]}")
    for _ in $(seq 300); do  # until requeued (bounded: 300 s)
      [ "$(job_field "$id" Restarts)" -ge 1 ] 2>/dev/null && break
      sleep 1
    done
    [ "$(job_field "$id" Restarts)" -ge 1 ] || fail "job $id was not requeued: $(tail -20 "$work/job.out")"
    scontrol update JobId="$id" TimeLimit=30 || fail "scontrol update TimeLimit=30 failed"
    state=$(wait_job "$id" 1200 release)
    say "job $id: $state after $(( $(date +%s) - start )) s, $(job_field "$id" Restarts) requeue(s)"
    [ "$state" = COMPLETED ] || fail "job $id ended $state: $(tail -30 "$work/job.out")"
    grep -q "the time limit is near" "$work/job.out" || fail "no time-limit warning in the output"
    grep -q "requeueing job $id" "$work/job.out" || fail "the script did not requeue"
    grep -q "stopped by a signal after step" "$work/job.out" || fail "no clean stop before the limit"
    grep "stopped by a signal after step\|^resuming from" "$work/job.out" | sed 's/^/  /'
    final=$(printf 'step-%08d.h5' "$steps")
    [ -f "$work/run/snapshots/$final" ] || fail "no final snapshot $final"
    grep -q "^resuming from .* at step" "$work/job.out" || fail "the requeued job did not resume"
    say "the same run uninterrupted on one node"
    reference "$work/straight" configs/demo_nerf.toml "${args[@]}"
    same_parameters "$work/run/snapshots/$final" "$work/straight/snapshots/$final" ||
      fail "the requeued run differs from the uninterrupted one"
    say "requeued, bitwise the uninterrupted run"
    ;;
  signals)
    args=("${NERF_ARGS[@]}" --set train.steps=100000 --set snapshot.every=0)
    id=$(CONFIG="$root/configs/demo_nerf.toml" TESSERA="$tessera" submit "$work/job.out" -- \
         --set "run.out_dir=$work/run" "${args[@]}")
    training "$id" "$work/run" 300
    sent=$(date +%s.%N)
    scancel --signal=TERM "$id"
    wait_for "$work/run/snapshots/step-*.h5" 120
    on_disk=$(date +%s.%N)
    state=$(wait_job "$id" 120)
    ended=$(date +%s.%N)
    [ "$state" = FAILED ] || fail "job $id ended $state, expected FAILED (exit code 4)"
    [ "$(job_field "$id" ExitCode)" = 4:0 ] || fail "exit code $(job_field "$id" ExitCode), expected 4:0"
    [ "$(job_field "$id" Restarts)" = 0 ] || fail "a stop by scancel was requeued"
    [ "$(ls "$work"/run/snapshots/step-*.h5 | wc -l)" -eq 1 ] || fail "not one stop snapshot"
    grep -q "stopped by a signal after step" "$work/job.out" || fail "no stop message"
    "$tessera" info "$(newest_snapshot "$work/run")" >/dev/null || fail "the stop snapshot does not validate"
    say "scancel --signal=TERM: snapshot on disk after $(awk -v a="$sent" -v b="$on_disk" 'BEGIN {printf "%.1f", b - a}') s, job ended after $(awk -v a="$sent" -v b="$ended" 'BEGIN {printf "%.1f", b - a}') s, exit code 4, not requeued"
    ;;
  two_jobs)
    long=("${NERF_ARGS[@]}" --set train.steps=100000 --set snapshot.every=0)
    first=$(CONFIG="$root/configs/demo_nerf.toml" TESSERA="$tessera" submit "$work/first.out" -- \
            --set "run.out_dir=$work/run" "${long[@]}")
    training "$first" "$work/run" 300
    lines_before=$(wc -l < "$work/run/metrics.jsonl")
    second=$(CONFIG="$root/configs/demo_nerf.toml" TESSERA="$tessera" submit "$work/second.out" \
             --nodes=1 --ntasks-per-node=1 -- --set "run.out_dir=$work/run" "${NERF_ARGS[@]}")
    [ "$(wait_job "$second" 300)" = FAILED ] || fail "the second job on a busy run directory ran"
    [ "$(job_field "$second" ExitCode)" = 2:0 ] || fail "second job: exit code $(job_field "$second" ExitCode)"
    grep -q "is in use by another training job (host .* job $first " "$work/second.out" ||
      fail "the refusal does not name the first job: $(tail -5 "$work/second.out")"
    beside=$(CONFIG="$root/configs/demo_nerf.toml" TESSERA="$tessera" submit "$work/beside.out" \
             --nodes=1 --ntasks-per-node=1 -- --set "run.out_dir=$work/beside" "${NERF_ARGS[@]}")
    [ "$(wait_job "$beside" 600)" = COMPLETED ] || fail "a job on another run directory failed: $(tail -5 "$work/beside.out")"
    [ "$(job_field "$first" JobState)" = RUNNING ] || fail "the first job stopped: $(job_field "$first" JobState)"
    [ "$(wc -l < "$work/run/metrics.jsonl")" -ge "$lines_before" ] || fail "metrics.jsonl shrank"
    head -1 "$work/run/metrics.jsonl" | grep -q '"step":4[,}]' || fail "metrics.jsonl lost its first records (log_every = 4)"
    scancel --signal=TERM "$first"
    [ "$(wait_job "$first" 120)" = FAILED ] && [ "$(job_field "$first" ExitCode)" = 4:0 ] ||
      fail "the first job did not stop with exit code 4"
    say "second job refused (exit 2, naming job $first); a job beside it completed"
    ;;
  lost_node)
    # A node lost mid-run (its slurmd and ranks killed, as by a power loss): the whole job ends
    # within 60 s with no rank left, the newest snapshot validates, the template requeues the job
    # and, once the node is back, it resumes and ends bitwise as the uninterrupted run.
    # At the default settings: a dead peer's MPI TCP connection gives no error and Slurm
    # notices a dead slurmd late, so it is the heartbeat (distributed.heartbeat_s, 20 s) that
    # ends the surviving ranks, long before the watchdog's 600 s.
    steps=400
    snapshotting_job
    lost=$(date +%s.%N)
    "$cluster" fail tnode2
    left=1
    for _ in $(seq 120); do  # until no rank is left on the surviving node (bounded: 60 s)
      left=$(ranks_on tnode1)
      [ "$left" = 0 ] && break
      sleep 0.5
    done
    gone=$(date +%s.%N)
    seconds=$(awk -v a="$lost" -v b="$gone" 'BEGIN {printf "%.1f", b - a}')
    [ "$left" = 0 ] || fail "$left rank(s) still running on tnode1 $seconds s after tnode2 was lost"
    awk -v s="$seconds" 'BEGIN {exit !(s <= 60)}' || fail "the job took $seconds s to end"
    newest=$(newest_snapshot "$work/run")
    "$tessera" info "$newest" >/dev/null || fail "the newest snapshot $newest does not validate"
    say "tnode2 lost: every rank gone after $seconds s; newest snapshot $(basename "$newest") validates"
    "$cluster" restore tnode2
    state=$(wait_job "$id" 900 release)
    [ "$state" = COMPLETED ] || fail "job $id ended $state: $(tail -20 "$work/job.out")"
    grep -q "sent no heartbeat for 20 s" "$work/run/logs"/rank-*.log ||
      fail "no rank on tnode1 reported the silent one: $(grep -h error "$work/run/logs"/rank-*.log)"
    grep -q "a rank, node or link was lost; requeueing job $id" "$work/job.out" ||
      fail "the template did not requeue the job: $(grep '^tessera:' "$work/job.out")"
    grep -q "^resuming from .*$(basename "$newest") at step" "$work/job.out" ||
      fail "the requeued job did not resume from $newest"
    reference "$work/straight" configs/demo_nerf.toml "${args[@]}"
    final=$(printf 'step-%08d.h5' "$steps")
    same_parameters "$work/run/snapshots/$final" "$work/straight/snapshots/$final" ||
      fail "the run resumed after the lost node differs from the uninterrupted one"
    say "requeued after the lost node, resumed from $(basename "$newest"), bitwise the uninterrupted run"
    ;;
  lost_link)
    # A node's link cut while the job writes a snapshot: every rank, on both sides of the cut,
    # is gone within 60 s (the heartbeat), the half-written snapshot never takes a snapshot's
    # name, and the job is requeued. The node stays lost: the pending job is resized to the one
    # node left (4 ranks -> 2), resumes the 4-rank snapshot and finishes.
    steps=300
    snapshotting_job
    for _ in $(seq 1200); do  # until the next snapshot is being written (bounded: 120 s)
      compgen -G "$work/run/snapshots/step-*.h5.tmp" >/dev/null && break
      sleep 0.1
    done
    writing=$(compgen -G "$work/run/snapshots/step-*.h5.tmp") || fail "no snapshot write seen"
    lost=$(date +%s.%N)
    "$cluster" fail tnode2 --link
    say "cut tnode2's link while $(basename "$writing") was being written"
    for _ in $(seq 120); do  # until no rank is left on either node (bounded: 60 s)
      [ "$(ranks_on tnode1)" = 0 ] && [ "$(ranks_on tnode2)" = 0 ] && break
      sleep 0.5
    done
    gone=$(date +%s.%N)
    seconds=$(awk -v a="$lost" -v b="$gone" 'BEGIN {printf "%.1f", b - a}')
    [ "$(ranks_on tnode1)$(ranks_on tnode2)" = 00 ] ||
      fail "ranks left $seconds s after the cut: tnode1 $(ranks_on tnode1), tnode2 $(ranks_on tnode2)"
    awk -v s="$seconds" 'BEGIN {exit !(s <= 60)}' || fail "the ranks took $seconds s to end"
    newest=$(newest_snapshot "$work/run")
    "$tessera" info "$newest" >/dev/null || fail "the newest snapshot $newest does not validate"
    if [ "$newest.tmp" = "$writing" ]; then cut="finished before the cut took effect"
    else cut="cut mid-write, never took a snapshot's name"; fi
    say "every rank gone $seconds s after the cut; the write was $cut; newest snapshot $(basename "$newest") validates"
    for _ in $(seq 120); do  # until requeued and Slurm has taken tnode2 down (bounded: 240 s)
      [ "$(job_field "$id" Restarts)" -ge 1 ] 2>/dev/null &&
        sinfo -h -n tnode2 -o %t | grep -q 'down\|drain\|fail' && break
      sleep 2
    done
    [ "$(job_field "$id" Restarts)" -ge 1 ] || fail "job $id was not requeued: $(tail -20 "$work/job.out")"
    [ "$(job_field "$id" JobState)" = PENDING ] || fail "job $id is $(job_field "$id" JobState), not pending"
    # What a user does with a requeued job whose node is gone: one node, 2 ranks. (NumCPUs: this
    # cluster's nodes have one core each, and the job was overcommitted.)
    # One update each, in this order: Slurm 22.05 recomputes the CPUs from the tasks after
    # applying NumCPUs in the same update.
    scontrol update JobId="$id" NumNodes=1 NumTasks=2 || fail "scontrol update NumNodes=1 failed"
    scontrol update JobId="$id" NumNodes=1-1 || fail "scontrol update NumNodes=1-1 failed"
    scontrol update JobId="$id" NumCPUs=1 || fail "scontrol update NumCPUs=1 failed"
    state=$(wait_job "$id" 900 release)
    [ "$state" = COMPLETED ] || fail "job $id on one node ended $state: $(tail -20 "$work/job.out")"
    grep -q "^resuming from .*$(basename "$newest") at step" "$work/job.out" ||
      fail "the resized job did not resume from $newest"
    grep -q "tessera train .*: rank 1 of 2, local rank 1 of 2 on tnode1" "$work/run/logs/rank-1.log" ||
      fail "the resized job did not run 2 ranks on tnode1"
    final="$work/run/snapshots/$(printf 'step-%08d.h5' "$steps")"
    "$tessera" info "$final" >/dev/null || fail "no final snapshot $final that validates"
    say "requeued onto tnode1 alone (4 ranks -> 2), resumed from $(basename "$newest") and finished"
    ;;
  runpath)
    # A node that does not see where the binary's libraries are (the builder's home not
    # mounted there): LibTorch's folder hidden on tnode2 by a mount of its own. The template
    # stops at its first step, exit 2, naming the node and the fix; no rank starts training.
    torch_lib=$(readelf -d "$tessera" | sed -n 's/.*RUNPATH.*\[\(.*\)\]/\1/p' | tr ':' '\n' |
                grep '/torch/lib$' | head -1)
    [ -n "$torch_lib" ] || fail "no torch/lib in the RUNPATH of $tessera"
    hidden=$(readlink -f "$torch_lib")
    [ -d "$hidden" ] || fail "$hidden is not a folder"
    "$cluster" exec tnode2 mount -t tmpfs tessera-hidden "$hidden" || fail "cannot hide $hidden on tnode2"
    id=$(CONFIG="$root/configs/demo_nerf.toml" TESSERA="$tessera" submit "$work/job.out" -- \
         --set "run.out_dir=$work/run" "${NERF_ARGS[@]}")
    state=$(wait_job "$id" 300)
    "$cluster" exec tnode2 umount "$hidden" || fail "cannot unhide $hidden on tnode2"
    hidden=""
    [ "$state" = FAILED ] && [ "$(job_field "$id" ExitCode)" = 2:0 ] ||
      fail "job $id ended $state, exit $(job_field "$id" ExitCode), expected FAILED 2:0: $(tail -8 "$work/job.out")"
    grep -q "does not start on every node of job $id" "$work/job.out" || fail "no preflight message: $(tail -8 "$work/job.out")"
    grep -q "tnode2" "$work/job.out" || fail "the node is not named: $(tail -8 "$work/job.out")"
    grep -q "TESSERA_VENV" "$work/job.out" || fail "the fix is not named"
    [ ! -e "$work/run/metrics.jsonl" ] || fail "a rank started training"
    [ "$(job_field "$id" Restarts)" = 0 ] || fail "bad input was requeued"
    sed -n '/does not start/,/TESSERA_VENV/p' "$work/job.out" | sed 's/^/  /'
    say "a node without the libraries: exit 2 at the first step, naming tnode2 and the fix"
    ;;
  *)
    echo "cluster_test.sh: unknown case '$case_name'" >&2
    exit 2
    ;;
esac
say "passed"
