# shellcheck shell=bash
# Shared logic of the sbatch files in this folder (never run directly): docs/slurm.md.
#
# Each sbatch file sets its #SBATCH defaults, sources this file and calls one function with its
# arguments: the recipe to run first (recipes/<name>.sh), its key=value overrides after it.
#   slurm_one_node RECIPE [key=value ...]     checks, then exec's the recipe (it gets the signals)
#   slurm_multi_node RECIPE [key=value ...]   Ray on the job's nodes, the recipe as its driver
# Every knob of the recipes is still an environment variable (sbatch passes the submitting
# shell's environment: --export=ALL, its default); the ones of this file:
#   LOCK_WAIT_S (120 here)      a requeued job waits that long for the previous instance's
#                               processes to end (recipes/lifecycle.sh, lock_run_dir), then refuses
#   SLURM_REQUEUE_ON_STOP (1)   a launch that stopped and saved before the run's end requeues
#                               its job (recipes/lifecycle.sh, requeue_if_stopped)
#   RAY_PORT (6379), RAY_JOIN_TIMEOUT_S (300)   several nodes: the head's port, and how long to
#                               wait for every node's GPUs to join
#   GPUS_PER_NODE               several nodes: GPUs per node (default: Slurm's SLURM_GPUS_ON_NODE)

# The repository: sbatch runs a copy of the script from its spool folder, so the folder the job
# was submitted from (submit from the repository's root) or VERL_GSM8K_ROOT.
slurm_root() {
  local root=${VERL_GSM8K_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
  if [[ ! -f "$root/recipes/common.sh" ]]; then
    echo "slurm: $root is not this repository (no recipes/common.sh): submit from the repository's root, or set VERL_GSM8K_ROOT" >&2
    exit 2
  fi
  echo "$root"
}

# Inside a Slurm job, with the client commands this file needs; otherwise one line.
slurm_require() {
  local file=$1 tool
  shift
  if [[ -z "${SLURM_JOB_ID:-}" ]]; then
    if ! command -v sbatch >/dev/null 2>&1; then
      echo "slurm: no Slurm here (sbatch not found): $file runs under Slurm (docs/slurm.md); without Slurm run the recipe itself: bash recipes/<recipe>.sh" >&2
    else
      echo "slurm: $file is a batch script: submit it, sbatch $file recipes/<recipe>.sh [key=value ...] (docs/slurm.md)" >&2
    fi
    exit 2
  fi
  for tool in "$@"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "slurm: $tool not found on $(hostname -s) inside job $SLURM_JOB_ID: $file needs Slurm's client commands on the compute nodes" >&2
      exit 2
    fi
  done
}

# The recipe to run: the first argument, a file of recipes/.
slurm_recipe() {
  local root=$1 recipe=${2:-}
  if [[ -z "$recipe" || "$recipe" == *=* ]]; then
    echo "slurm: the first argument is the recipe to run (recipes/<name>.sh), its key=value overrides after it; got '${recipe}'" >&2
    exit 2
  fi
  [[ "$recipe" == /* ]] || recipe=$root/$recipe
  if [[ ! -f "$recipe" ]]; then
    echo "slurm: no recipe $recipe (the first argument: recipes/<name>.sh)" >&2
    exit 2
  fi
  echo "$recipe"
}

slurm_say_job() {
  echo "slurm: job $SLURM_JOB_ID (${SLURM_JOB_NAME:-}) restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST:-$(hostname -s)}: $*"
}

# One node: the recipe replaces this shell, so `--signal=B:TERM@N` reaches the launcher itself
# (recipes/common.sh turns it into "save the step in flight, then stop"). The run directory is
# the recipe's (RUNS_ROOT/EXPERIMENT_NAME, from the environment captured at submission): the same
# across requeues, so each requeued start resumes it.
slurm_one_node() {
  slurm_require slurm/one_node.sbatch squeue scontrol
  local root recipe
  root=$(slurm_root)
  recipe=$(slurm_recipe "$root" "${1:-}")
  shift
  export LOCK_WAIT_S=${LOCK_WAIT_S:-120}
  export SLURM_REQUEUE_ON_STOP=${SLURM_REQUEUE_ON_STOP:-1}
  cd "$root" || exit 2
  slurm_say_job "bash ${recipe#"$root"/} $* (LOCK_WAIT_S=$LOCK_WAIT_S, requeue on a stop: $SLURM_REQUEUE_ON_STOP)"
  exec bash "$recipe" "$@"
}

# ---- several nodes: Ray on Slurm -------------------------------------------------------------
RAY_PIDS=()

# Every node of the job sees the same run directory: a file written here must exist on each
# node (RUN_DIR if set, else RUNS_ROOT, where the recipe puts it). One line when a node lacks it.
slurm_check_shared() {
  local base=$1 token seen
  mkdir -p "$base"
  token=$base/.slurm-shared-check-$SLURM_JOB_ID
  : >"$token"
  seen=$(srun --overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 bash -c \
    "if [[ -e '$token' ]]; then echo ok; else echo \"missing \$(hostname -s)\"; fi" 2>&1 || true)
  rm -f "$token"
  if grep -q '^missing ' <<<"$seen" || ! grep -q '^ok' <<<"$seen"; then
    echo "slurm: $base is not on storage every node mounts ($(grep '^missing ' <<<"$seen" | sed 's/^missing /not seen on /' | paste -sd, -)): every node writes its ranks' checkpoint shards there; set RUNS_ROOT (or RUN_DIR) to a shared filesystem (docs/slurm.md)" >&2
    exit 2
  fi
}

# Ray's processes block SIGTERM (slurm_multi_node), so they are ended by `ray stop --force`
# (SIGKILL) on every node; each `ray start --block` then exits, and its srun step with it. An srun
# that cannot start (the job already ending) leaves them to Slurm's SIGKILL at the job's end.
slurm_ray_teardown() {
  local pid end=$((SECONDS + 30))
  if [[ ${#RAY_PIDS[@]} -gt 0 ]]; then
    echo "slurm: stopping Ray on the job's nodes"
    timeout 60 srun --overlap --nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node=1 \
      "$RAY" stop --force >/dev/null 2>&1 || true
    for pid in "${RAY_PIDS[@]}"; do
      while kill -0 "$pid" 2>/dev/null && (( SECONDS < end )); do sleep 1 || true; done
      kill -KILL "$pid" 2>/dev/null || true   # no `wait`: see slurm_multi_node
    done
  fi
}

# The GPUs Ray counts on the cluster at $1 ("ray status"), 0 when it does not answer.
slurm_ray_gpus() {
  local gpus
  gpus=$("$RAY" status --address "$1" 2>/dev/null | sed -n 's#^ *[0-9.]*/\([0-9.]*\) GPU.*#\1#p' | sed -n 1p)  # sed reads it all: no SIGPIPE under pipefail
  echo "${gpus%%.*}"
}

# Several nodes: `ray start --head` on the first node (where this batch shell runs), a worker on
# each other node (srun), a bounded wait until every node's GPUs have joined, then the recipe as
# Ray's driver on the head (RAY_ADDRESS: recipes/common.sh attaches to the cluster). SIGTERM is
# passed on to the recipe (it saves and stops); Ray is stopped on every node when this shell ends.
# Each `ray start` runs with SIGTERM blocked (python -m verl_gsm8k.guard.reap exec), a mask its
# daemons and workers inherit: a SIGTERM to every process of the job (the time limit without
# `B:`, a preemption, scancel) leaves the cluster up while the trainer saves the step in flight.
slurm_multi_node() {
  slurm_require slurm/multi_node.sbatch srun scontrol squeue
  local root recipe
  root=$(slurm_root)
  recipe=$(slurm_recipe "$root" "${1:-}")
  shift
  RAY=${RAY:-$root/.venv/bin/ray}
  local python=${PYTHON:-$root/.venv/bin/python}
  local blocked=("$python" -m verl_gsm8k.guard.reap exec --)
  export LOCK_WAIT_S=${LOCK_WAIT_S:-120}
  export SLURM_REQUEUE_ON_STOP=${SLURM_REQUEUE_ON_STOP:-1}
  local nodes=${SLURM_JOB_NUM_NODES:-1} gpus=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}
  local port=${RAY_PORT:-6379} timeout=${RAY_JOIN_TIMEOUT_S:-300}
  if [[ ! "$gpus" =~ ^[0-9]+$ || "$gpus" -lt 1 ]]; then
    echo "slurm: GPUs per node unknown (SLURM_GPUS_ON_NODE unset: ask for them with --gpus-per-node, or set GPUS_PER_NODE)" >&2
    exit 2
  fi
  slurm_check_shared "${RUN_DIR:-${RUNS_ROOT:-$root/runs}}"
  local head head_ip
  head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)  # not head: a SIGPIPE to scontrol fails the pipeline
  head_ip=$(srun --overlap --nodes=1 --ntasks=1 -w "$head" hostname -I | awk '{print $1}')
  local address=$head_ip:$port
  trap slurm_ray_teardown EXIT
  # SIGTERM from here on: passed on to the recipe once it runs (it saves, then stops); before it
  # runs, nothing is trained and the recipe is not started
  local driver="" stopping=""
  trap 'stopping=1; if [[ -n "$driver" ]]; then pkill -TERM -P "$driver" || true; fi' TERM
  slurm_say_job "Ray head on $head ($address), $nodes node(s) x $gpus GPU(s)"
  srun --overlap --nodes=1 --ntasks=1 -w "$head" --chdir="$root" "${blocked[@]}" "$RAY" start --head --block \
    --node-ip-address="$head_ip" --port="$port" --num-gpus="$gpus" &
  RAY_PIDS+=($!)
  if (( nodes > 1 )); then
    sleep 5 || true
    srun --overlap --nodes=$((nodes - 1)) --ntasks=$((nodes - 1)) --ntasks-per-node=1 -x "$head" \
      --chdir="$root" "${blocked[@]}" "$RAY" start --block --address="$address" --num-gpus="$gpus" &
    RAY_PIDS+=($!)
  fi
  local want=$((nodes * gpus)) have=0 waited=0
  while (( waited < timeout )); do
    have=$(slurm_ray_gpus "$address")
    (( ${have:-0} >= want )) && break
    sleep 5 || true
    waited=$((waited + 5))
  done
  if (( ${have:-0} < want )); then
    echo "slurm: after RAY_JOIN_TIMEOUT_S=$timeout s the Ray cluster at $address has ${have:-0} of $want GPUs ($nodes node(s) x $gpus): a node never joined (its ray start output is above); nothing was trained" >&2
    exit 2
  fi
  slurm_say_job "all $want GPUs joined in ${waited} s: bash ${recipe#"$root"/} $*"
  export RAY_ADDRESS=$address NNODES=$nodes NDEVICES_PER_NODE=$gpus DEVICE=${DEVICE:-gpu}
  cd "$root" || exit 2
  if [[ -n "$stopping" ]]; then
    echo "slurm: SIGTERM before the recipe started: nothing trained, the recipe not started" >&2
    return 143
  fi
  # The recipe under a subshell that ignores SIGTERM once the recipe is started (the recipe keeps
  # its own trap) and writes the recipe's status: bash's `wait` for a pid, cut short by a trapped
  # signal, may then lose that status or hang (bash 5.2). This shell polls the subshell instead.
  local status_file status
  status_file=$(mktemp "${TMPDIR:-/tmp}/slurm-recipe-status.XXXXXX")
  ( trap ':' TERM
    bash "$recipe" "$@" &
    child=$!
    trap '' TERM
    wait "$child" && echo 0 >"$status_file" || echo "$?" >"$status_file" ) &
  driver=$!
  # (no `wait` for it: bash reaps it; a `wait` here is the call that hung)
  while kill -0 "$driver" 2>/dev/null; do sleep 1 || true; done  # a SIGTERM to all ends sleep too
  status=$(cat "$status_file" 2>/dev/null || true)
  rm -f "$status_file"
  return "${status:-1}"
}
