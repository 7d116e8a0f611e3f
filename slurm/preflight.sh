# Sourced by every template in slurm/ at the top of the job, on the allocation's first node, to check what
# the job got before any training process starts, and to set what those processes read:
#   TRAINUP_PYTHON            the course's .venv/bin/python (or python3), checked to import torch
#   MASTER_ADDR, MASTER_PORT  where rank 0 (or torchrun's rendezvous) listens: the first node, a port from the job id
#   OMP_NUM_THREADS           the threads each process computes with: its cores on CPUs, 2 on GPUs
#   TRAINUP_WORKERS           DataLoader workers per process: a GPU process's other cores (0 on CPUs)
#   TRAINUP_WORLD_SIZE        the training processes of the whole job
# A problem stops the job with one "error: ..." line in its output file and exit status 2.
#
# The template sets, before sourcing:
#   TRAINUP_LAUNCH=srun      srun starts one training process per task (per GPU, or per CPU share)
#   TRAINUP_LAUNCH=torchrun  srun starts one torchrun per node (one task per node); torchrun starts the processes
#   TRAINUP_GPUS=N           GPUs each node must have for this template (0: a CPU-only template)
# You may set, when submitting (sbatch exports your environment to the job):
#   TRAINUP_PYTHON=/path/to/python  another environment (e.g. your cluster's PyTorch module's python)
#   TRAINUP_PORT=N                  a fixed rendezvous port instead of one derived from the job id

trainup_error() {
  echo "error: $*" >&2
  exit 2
}

# The first number of SLURM's "2(x3),1" notation: tasks on the first node.
trainup_first_count() { local v=${1%%[(,]*}; echo "${v:-0}"; }

# 1. Tasks per node against GPUs per node.
TRAINUP_TASKS_PER_NODE=${SLURM_NTASKS_PER_NODE:-$(trainup_first_count "${SLURM_TASKS_PER_NODE:-1}")}
if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
  TRAINUP_GPUS_HERE=$SLURM_GPUS_ON_NODE
elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "${CUDA_VISIBLE_DEVICES}" != NoDevFiles ]; then
  TRAINUP_GPUS_HERE=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
else
  TRAINUP_GPUS_HERE=0
fi
if [ "${TRAINUP_GPUS:-0}" -gt 0 ]; then
  [ "$TRAINUP_GPUS_HERE" -gt 0 ] ||
    trainup_error "this job got no GPU (SLURM_GPUS_ON_NODE and CUDA_VISIBLE_DEVICES are empty): keep the" \
      "template's '#SBATCH --gres=gpu:$TRAINUP_GPUS' and submit to a partition with GPUs (--partition=...)"
  if [ "${TRAINUP_LAUNCH:-srun}" = srun ] && [ "$TRAINUP_TASKS_PER_NODE" -gt "$TRAINUP_GPUS_HERE" ]; then
    trainup_error "$TRAINUP_TASKS_PER_NODE tasks per node but only $TRAINUP_GPUS_HERE GPU(s) per node: with" \
      "srun, each task is one training process on one GPU, so set --ntasks-per-node=$TRAINUP_GPUS_HERE"
  fi
  if [ "${TRAINUP_LAUNCH:-srun}" = srun ] && [ "$TRAINUP_TASKS_PER_NODE" -lt "$TRAINUP_GPUS_HERE" ]; then
    echo "warning: $TRAINUP_TASKS_PER_NODE task(s) per node for $TRAINUP_GPUS_HERE GPUs: some GPUs stay idle" >&2
  fi
fi
if [ "${TRAINUP_LAUNCH:-srun}" = torchrun ]; then
  [ "$TRAINUP_TASKS_PER_NODE" -eq 1 ] ||
    trainup_error "$TRAINUP_TASKS_PER_NODE tasks per node, but srun torchrun needs exactly one per node" \
      "(torchrun itself starts the processes of its node): set --ntasks-per-node=1"
  # torchrun's processes per node: one per GPU, or what a CPU template asked for.
  export TRAINUP_NPROC_PER_NODE=${TRAINUP_NPROC_PER_NODE:-$TRAINUP_GPUS_HERE}
  [ "$TRAINUP_NPROC_PER_NODE" -gt 0 ] || trainup_error "TRAINUP_NPROC_PER_NODE must be 1 or more for torchrun"
fi

# The job's training processes: one per task with srun, torchrun's per node otherwise.
if [ "${TRAINUP_LAUNCH:-srun}" = torchrun ]; then
  export TRAINUP_WORLD_SIZE=$(( SLURM_JOB_NUM_NODES * TRAINUP_NPROC_PER_NODE ))
else
  export TRAINUP_WORLD_SIZE=${SLURM_NTASKS:-$(( SLURM_JOB_NUM_NODES * TRAINUP_TASKS_PER_NODE ))}
fi

# 2. The Python environment: the course's .venv when the job was submitted from the course folder.
if [ -z "${TRAINUP_PYTHON:-}" ]; then
  if [ -x "$SLURM_SUBMIT_DIR/.venv/bin/python" ]; then
    TRAINUP_PYTHON=$SLURM_SUBMIT_DIR/.venv/bin/python
  else
    TRAINUP_PYTHON=$(command -v python3 || true)
  fi
fi
[ -n "$TRAINUP_PYTHON" ] && [ -x "$(command -v "$TRAINUP_PYTHON" || true)" ] ||
  trainup_error "no Python found (no .venv in $SLURM_SUBMIT_DIR, no python3 on PATH, TRAINUP_PYTHON=" \
    "'${TRAINUP_PYTHON:-}'): run tools/setup_env.sh in the course folder, or load your cluster's Python module"
# Whether torch is installed, without importing it (an import costs seconds on every job).
TRAINUP_TORCH=$("$TRAINUP_PYTHON" -c 'import importlib.metadata as m, importlib.util as u
assert u.find_spec("torch"); print(m.version("torch"))' 2>/dev/null) ||
  trainup_error "$TRAINUP_PYTHON cannot import torch: run tools/setup_env.sh in the course folder (it creates" \
    ".venv), load your cluster's PyTorch module, or point TRAINUP_PYTHON at a python that has torch"
export TRAINUP_PYTHON

# 3. Where the processes meet: the first node of the allocation, at a port derived from the job id
# (two jobs that share a node rarely collide: their ids would differ by a multiple of 20,000;
# the check below catches it, or another program on that port, when they do). NodeAddr is the
# address SLURM itself uses for the node.
TRAINUP_FIRST_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$TRAINUP_FIRST_NODE" 2>/dev/null | tr ' ' '\n' | sed -n 's/^NodeAddr=//p' | head -n 1)
export MASTER_ADDR=${MASTER_ADDR:-$TRAINUP_FIRST_NODE}
export MASTER_PORT=${TRAINUP_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
# This script runs on the first node, so a connection that succeeds means something there already listens.
if (exec 3<>"/dev/tcp/$MASTER_ADDR/$MASTER_PORT") 2>/dev/null; then
  trainup_error "port $MASTER_PORT on $MASTER_ADDR ($TRAINUP_FIRST_NODE) is already in use, so rank 0 could not" \
    "listen there: submit again (the port follows the job id) or set TRAINUP_PORT to a free port"
fi

# 4. CPU threads per process: the cores SLURM gave each task (a torchrun task shares them among its processes).
TRAINUP_PROCS_PER_TASK=1
if [ "${TRAINUP_LAUNCH:-srun}" = torchrun ]; then TRAINUP_PROCS_PER_TASK=$TRAINUP_NPROC_PER_NODE; fi
TRAINUP_THREADS=$(( ${SLURM_CPUS_PER_TASK:-1} / TRAINUP_PROCS_PER_TASK ))
TRAINUP_THREADS=$(( TRAINUP_THREADS > 0 ? TRAINUP_THREADS : 1 ))
if [ "${TRAINUP_GPUS:-0}" -gt 0 ]; then
  # A GPU process's maths runs on its GPU: 2 threads are enough for the rest (at most its cores), and its
  # other cores go to its DataLoader workers (one thread each), so threads + workers = its cores.
  export OMP_NUM_THREADS=$(( TRAINUP_THREADS >= 2 ? 2 : 1 ))
  export TRAINUP_WORKERS=$(( TRAINUP_THREADS - OMP_NUM_THREADS ))
else
  export OMP_NUM_THREADS=$TRAINUP_THREADS TRAINUP_WORKERS=0  # a CPU process computes on all its cores
fi
# Slurm 22.05 to 23.02's srun does not inherit sbatch's --cpus-per-task; this passes it on in every version.
export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}

echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME): $SLURM_JOB_NUM_NODES node(s) $SLURM_JOB_NODELIST," \
  "$TRAINUP_TASKS_PER_NODE task(s) per node, ${SLURM_CPUS_PER_TASK:-1} CPU(s) per task, $TRAINUP_WORLD_SIZE process(es)," \
  "$TRAINUP_GPUS_HERE GPU(s) per node (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-none})"
echo "rendezvous at $MASTER_ADDR:$MASTER_PORT; ${TRAINUP_PYTHON#"$SLURM_SUBMIT_DIR"/} (torch $TRAINUP_TORCH);" \
  "OMP_NUM_THREADS=$OMP_NUM_THREADS, $TRAINUP_WORKERS DataLoader worker(s) per process"
