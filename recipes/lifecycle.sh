# shellcheck shell=bash
# shellcheck disable=SC2153  # STOP_GRACE_S, LOCK_WAIT_S, RUN_DIR ...: common.sh's knobs, set before any call
# How a launch lives and ends, sourced by recipes/common.sh (never run directly): one launch per
# run directory (lock_run_dir), a SIGTERM or Ctrl-C turned into a stop request (request_stop,
# interrupt), the Slurm job's end as the trainer's deadline (slurm_job_end, plan_deadline), the
# grace a stop gets (plan_grace), waiting for verl and stopping what outlives the grace
# (wait_for_verl), and the requeue of a Slurm job that stopped before the end of its run
# (requeue_if_stopped). `launch` in common.sh calls them; they read its variables (RUN_DIR,
# PYTHON, STOP_GRACE_S, LOCK_WAIT_S, VERL_PID, VERL_STATUS_FILE) when called.
# docs/slurm.md and docs/reliability.md say what each does for a run.

# One launch at a time per run directory: two would write the same checkpoints over each other.
# The lock is flock(1) on RUN_DIR/.launch.lock, held through file descriptor 9 by this shell and
# the processes it starts (verl's driver inherits it): the kernel releases it when the last of
# them ends, so a SIGKILL leaves no stale lock. The file names the launch that holds it. A launch
# that finds it held waits LOCK_WAIT_S seconds (a requeued job whose predecessor is still saving),
# then refuses in one line, before it has touched anything.
lock_run_dir() {
  local lock=$RUN_DIR/.launch.lock holder
  mkdir -p "$RUN_DIR"
  exec 9>>"$lock"
  if ! flock -n 9; then
    holder=$(cat "$lock" 2>/dev/null || true)
    if (( LOCK_WAIT_S > 0 )); then
      echo "recipe: $RUN_DIR is in use by ${holder:-another launch}: waiting up to LOCK_WAIT_S=$LOCK_WAIT_S s for it to end" >&2
    fi
    if (( LOCK_WAIT_S == 0 )) || ! flock -w "$LOCK_WAIT_S" 9; then
      holder=$(cat "$lock" 2>/dev/null || true)
      local pid alive="still running"
      pid=$(sed -n 's/.*, pid \([0-9]*\) on .*/\1/p' <<<"$holder")
      if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
        alive="its launcher has ended, processes it started still run: fuser -v $lock lists them"
      fi
      echo "recipe: $RUN_DIR is in use by ${holder:-another launch} ($alive): one launch at a time per run directory; wait for it to end (LOCK_WAIT_S), stop it, or set another EXPERIMENT_NAME" >&2
      exit 2
    fi
  fi
  # Ray's processes do not inherit the lock (its file descriptor): processes of an earlier launch
  # into RUN_DIR that outlived it (verl_gsm8k/guard/reap.py finds them by their environment) hold
  # none, and are waited for, then refused in one line, the same way.
  "$PYTHON" -m verl_gsm8k.guard.reap check --run-dir "$RUN_DIR" --wait "$LOCK_WAIT_S" || exit 2
  printf 'launch %s, pid %s on %s\n' "$1" "$$" "${HOSTNAME:-localhost}" >"$lock"
}

# The end of the Slurm job this launch runs in (epoch seconds), or nothing: SLURM_JOB_END_TIME
# where Slurm sets it (23.02 and later), else squeue's end time (%e), which a preemption's
# GraceTime and `scontrol update TimeLimit` move. Nothing outside a job or without a time limit.
slurm_job_end() {
  [[ -n "${SLURM_JOB_ID:-}" ]] || return 0
  if [[ "${SLURM_JOB_END_TIME:-}" =~ ^[0-9]+$ && "$SLURM_JOB_END_TIME" -gt 0 ]]; then
    echo "$SLURM_JOB_END_TIME"; return 0
  fi
  local end
  end=$(squeue -h -j "$SLURM_JOB_ID" -o %e 2>/dev/null | sed -n 1p) || return 0
  [[ "$end" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T ]] || return 0   # NONE, Unknown: no limit
  date -d "$end" +%s 2>/dev/null || true
}

# SIGTERM (a preemption: Slurm, Kubernetes, spot instances): ask the trainer to save the step in
# flight and stop (RUN_DIR/stop_requested holds the deadline); after STOP_GRACE_S, stop verl.
# In a Slurm job with an end time and no STOP_GRACE_S of the user's, the grace runs to 5 s
# before the job's end (read now: a preemption's GraceTime moves it), which is what Slurm allows.
request_stop() {
  [[ -z "${STOP_DEADLINE:-}" ]] || return 0
  local now end why="STOP_GRACE_S=$STOP_GRACE_S s"
  now=$(date +%s)
  STOP_DEADLINE=$(( now + STOP_GRACE_S ))
  if [[ -z "$STOP_GRACE_SET" ]]; then end=$(slurm_job_end); else end=""; fi
  if [[ -n "$end" ]] && (( end - 5 > now )); then
    STOP_DEADLINE=$(( end - 5 ))
    why="$(( STOP_DEADLINE - now )) s: 5 s before Slurm job $SLURM_JOB_ID ends; STOP_GRACE_S sets it"
  fi
  echo "$STOP_DEADLINE" >"$RUN_DIR/stop_requested.tmp" && mv -f "$RUN_DIR/stop_requested.tmp" "$RUN_DIR/stop_requested"
  echo "recipe: SIGTERM: the trainer saves the step in flight and stops (within $why)" >&2
}

# A Slurm job's end, for the trainer (RUN_DIR/job_deadline, verl_gsm8k/guard/deadline.py): it
# saves and stops before a step that would not end in time. Refused in one line (exit 2) when the
# start-up, a step and a save measured by earlier launches of the run do not fit the time left.
# Outside Slurm, a deadline left by an earlier launch is removed.
plan_deadline() {
  rm -f "$RUN_DIR/job_deadline"
  local end
  end=$(slurm_job_end)
  if [[ -z "$end" ]]; then
    if [[ -n "${SLURM_JOB_ID:-}" ]]; then
      echo "recipe: Slurm job $SLURM_JOB_ID has no end time (no time limit): no deadline"
    fi
    return 0
  fi
  "$PYTHON" -m verl_gsm8k.guard.deadline "$RUN_DIR" --end "$end"
}

# STOP_GRACE_S for this launch, said in one line: what a stop needs here (a step, its validation
# and save, measured in RUN_DIR/timings.json) when the user set none; a warning when a set one, or
# a Ray job's RAY_JOB_STOP_WAIT_TIME_S, is shorter (verl_gsm8k/guard/grace.py).
plan_grace() {
  local said
  # a Slurm job with an end time: a stop gets until 5 s before it (request_stop, said by plan_deadline)
  if [[ -z "$STOP_GRACE_SET" && -s "$RUN_DIR/job_deadline" ]]; then return 0; fi
  said=$(STOP_GRACE_S=${STOP_GRACE_SET:+$STOP_GRACE_S} "$PYTHON" -m verl_gsm8k.guard.grace "$RUN_DIR") || return $?
  STOP_GRACE_S=${said##*$'\n'}   # its last line; the line saying why before it
  if [[ "$said" == *$'\n'* ]]; then echo "${said%$'\n'*}"; fi
}

# Under slurm/one_node.sbatch (SLURM_REQUEUE_ON_STOP=1): a launch that stopped before the end of
# the run (exit 5: SIGTERM or the job's end) and saved a step puts its job back in the queue, so
# that the same job resumes until the run ends (docs/slurm.md, "Time limits"). A launch that saved
# nothing is not requeued: the next one would do no better.
requeue_if_stopped() {
  local status=$1 stamp=$2 step saved_by="" restarts
  [[ "$status" == 5 && "${SLURM_REQUEUE_ON_STOP:-0}" == 1 && -n "${SLURM_JOB_ID:-}" ]] || return 0
  step=$(cat "$RUN_DIR/latest_checkpointed_iteration.txt" 2>/dev/null || true)
  if [[ -n "$step" ]]; then saved_by=$(cat "$RUN_DIR/global_step_$step/launch_stamp.txt" 2>/dev/null || true); fi
  if [[ "$saved_by" != "$stamp" ]]; then
    echo "recipe: Slurm job $SLURM_JOB_ID not requeued: this launch saved no step (start-up, a step and a save did not fit before it stopped); resubmit with more time (sbatch --time)" >&2
    return 0
  fi
  # Slurm requeues it already (a preemption, `scontrol requeue`): its restart count went up, and
  # a second requeue would fail ("Job is pending execution")
  restarts=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.* Restarts=\([0-9]*\).*/\1/p') || true
  if (( ${restarts:-0} > ${SLURM_RESTART_COUNT:-0} )); then
    echo "recipe: Slurm requeued job $SLURM_JOB_ID itself (restart $restarts: a preemption or scontrol requeue): it resumes from step $step"
    return 0
  fi
  echo "recipe: requeueing Slurm job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}): it resumes from step $step"
  scontrol requeue "$SLURM_JOB_ID" || echo "recipe: scontrol requeue $SLURM_JOB_ID failed: resubmit the same command to resume" >&2
}

# Every process started under PID (verl's driver, Ray's processes and workers), deepest last.
descendants() {
  local child
  for child in $(pgrep -P "$1"); do echo "$child"; descendants "$child"; done
}

# Ctrl-C: stop verl now (SIGTERM to every process it started); the checkpoints saved so far stay.
interrupt() {
  echo "recipe: interrupted: stopping verl" >&2
  KILL_NOW=1   # wait_for_verl: SIGTERM, then SIGKILL (verl's processes block SIGTERM)
}

# The last command of verl's subshell (common.sh): its status written to VERL_STATUS_FILE, then
# the subshell's exit with it. bash's own `wait` for the subshell, once a trapped SIGTERM has cut a
# `wait` short and the subshell ended meanwhile, returned 255 for a 5 (6 of 40 tries, bash 5.2.15;
# the same call in slurm/common.sh also hung, 2 of 24); wait_for_verl reads the file instead.
exit_recorded() {
  echo "$1" >"$VERL_STATUS_FILE"
  exit "$1"
}

# wait for verl; a trapped signal interrupts `wait`, so wait again until verl ends or the grace is
# over (then SIGTERM to every process verl started, SIGKILL to what is left 10 s later).
wait_for_verl() {
  local recorded
  while :; do
    wait "$VERL_PID"
    if ! kill -0 "$VERL_PID" 2>/dev/null; then
      # verl ended: its status as recorded (exit_recorded); bash's only if none was (a SIGKILL)
      recorded=$(cat "$VERL_STATUS_FILE" 2>/dev/null || true)
      if [[ "$recorded" =~ ^[0-9]+$ ]]; then return "$recorded"; fi
      wait "$VERL_PID"
      return $?
    fi
    while [[ -n "${STOP_DEADLINE:-}${KILL_NOW:-}" ]] && kill -0 "$VERL_PID" 2>/dev/null; do
      if [[ -n "${KILL_NOW:-}" ]] || (( $(date +%s) >= STOP_DEADLINE )); then
        [[ -n "${KILL_NOW:-}" ]] || echo "recipe: STOP_GRACE_S=$STOP_GRACE_S s are over: stopping verl" >&2
        local pids
        pids=$(descendants "$VERL_PID")
        # shellcheck disable=SC2086  # one word per pid
        kill -TERM $pids 2>/dev/null
        sleep 10
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null
        wait "$VERL_PID"
        return 143
      fi
      sleep 1
    done
  done
}

