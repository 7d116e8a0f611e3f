#!/usr/bin/env bash
# Create .venv with the pinned packages of requirements.txt: once, and again when that file changes.
# It says what it does, step by step; pip's own output goes to .venv-install.log.
#
#   tools/setup_env.sh              PyPI's CUDA build of torch (about 5.4 GB; also runs without a GPU)
#   tools/setup_env.sh --cpu        the CPU-only build of the same versions (also TRAINUP_CPU_ONLY=1)
#   tools/setup_env.sh --cuda12     the CUDA 12.6 build of the same versions (an NVIDIA driver older than 580)
#   tools/setup_env.sh --dry-run    check Python, say what would be installed and where, change nothing
#   tools/setup_env.sh --conda      use the active conda environment made from environment.yml: .venv
#                                   becomes a link to it (both commands, Horovod's build and SLURM follow)
#   PYTHON=python3.12 tools/...     the Python to build .venv from (default python3; 3.11 to 3.14)
#
# Which Python versions and which PyTorch build: tools/setup_choice.py (tested in tests/test_setup.py).
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
conda=${TRAINUP_CONDA:-0}
for arg in "$@"; do
  case $arg in
    --cpu|--cuda12) ;;  # read by tools/setup_choice.py
    --dry-run) dry=1 ;;
    --conda) conda=1 ;;
    *) echo "error: unknown option $arg (tools/setup_env.sh [--cpu|--cuda12|--conda] [--dry-run])" >&2; exit 2 ;;
  esac
done
LOG=.venv-install.log
say() { echo "setup: $*"; }
# The course's own packages (trainup, lessons; pyproject.toml), editable: notebooks and solutions import
# them from this checkout's scripts/ without touching sys.path. Once per .venv and checkout.
course() {
  local here
  # what the environment itself imports: a PYTHONPATH of the shell's would answer for it
  here=$(env -u PYTHONPATH .venv/bin/python -c \
         'import os, lessons; print(os.path.dirname(os.path.dirname(lessons.__file__)))' \
         2>/dev/null || true)
  [ "$here" = "$PWD/scripts" ] && return 0
  if ! .venv/bin/python -m pip install --no-deps --no-build-isolation --editable . >> "$LOG" 2>&1; then
    echo "error: pip could not install the course's packages (pip install -e .): $(grep -m1 -E '^ERROR:' "$LOG" || tail -1 "$LOG") (pip's full output: $LOG)" >&2
    exit 1
  fi
  say "  the course's packages (trainup, lessons) installed from $PWD/scripts (pip install -e .)"
}

if [ "$conda" != 0 ]; then
  # conda env create -f environment.yml && conda activate trainup, then this: no second 5.4 GB environment.
  if [ -z "${CONDA_PREFIX:-}" ] || [ ! -x "$CONDA_PREFIX/bin/python" ]; then
    echo "error: --conda uses the active conda environment and none is active: run conda env create -f environment.yml && conda activate trainup first" >&2
    exit 2
  fi
  if [ -e .venv ] && [ "$(readlink .venv || true)" != "$CONDA_PREFIX" ]; then
    echo "error: .venv already holds another environment; move it away (mv .venv .venv.pip) to use the conda one at $CONDA_PREFIX" >&2
    exit 2
  fi
  pyver=$("$CONDA_PREFIX/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  "$CONDA_PREFIX/bin/python" tools/setup_choice.py python "$pyver" || exit 2
  say "conda: .venv is a link to the active environment, $CONDA_PREFIX (Python $pyver)"
  if [ $dry = 1 ]; then
    say "  would run: ln -s $CONDA_PREFIX .venv && .venv/bin/python -m pip install --requirement requirements.txt (nothing to install when it was made from environment.yml)"
    say "then: tools/build_horovod.sh (lesson 05's Horovod, built once, into that environment)"
    exit 0
  fi
  ln -sfn "$CONDA_PREFIX" .venv
  if ! .venv/bin/python -m pip install --progress-bar off --requirement requirements.txt > "$LOG" 2>&1; then
    echo "error: pip could not complete the conda environment from requirements.txt: $(grep -m1 -E '^ERROR:' "$LOG" || tail -1 "$LOG") (pip's full output: $LOG)" >&2
    exit 1
  fi
  .venv/bin/python -c 'import torch, torchvision, pytorch_lightning' \
    || { echo "error: torch, torchvision or Lightning does not import in $CONDA_PREFIX (see $LOG)" >&2; exit 1; }
  sha256sum requirements.txt | cut -d' ' -f1 > .venv/.requirements.sha256  # both commands reuse it now
  course
  exec tools/build_horovod.sh
fi

# Up to date already (either build): only lesson 05's Horovod is checked (built once, then reused).
want=$(sha256sum requirements.txt | cut -d' ' -f1)
have=$(cat .venv/.requirements.sha256 2>/dev/null || true)
explicit=0
{ [[ " $* " == *" --cpu "* ]] || [[ " $* " == *" --cuda12 "* ]] || [ "${TRAINUP_CPU_ONLY:-0}" != 0 ]; } && explicit=1
if [ -x .venv/bin/python ] && { [ "$have" = "$want cpu" ] || [ "$have" = "$want cu126" ] \
     || { [ "$have" = "$want" ] && [ $explicit = 0 ]; }; }; then
  if [ $dry = 1 ]; then say ".venv is up to date with requirements.txt; would only run tools/build_horovod.sh"; exit 0; fi
  course
  exec tools/build_horovod.sh  # TRAINUP_SKIP_HOROVOD=1 skips it
fi

python=${PYTHON:-python3}
say "step 1/4: Python"
command -v "$python" >/dev/null || { echo "error: $python not found: install Python 3.11 to 3.14 and set PYTHON to it" >&2; exit 2; }
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
  || { echo "error: $python does not run; set PYTHON to a Python 3.11 to 3.14" >&2; exit 2; }
"$python" tools/setup_choice.py python "$pyver" || exit 2
say "  $("$python" --version 2>&1) at $(command -v "$python"): supported (3.11 to 3.14)"

say "step 2/4: which PyTorch build"
choice=$("$python" tools/setup_choice.py choose "$@")
flavour=$(head -1 <<<"$choice")
say "  $(tail -n +2 <<<"$choice")"

n=$(grep -cv '^\s*\(#\|$\)' requirements.txt)
if [ "$flavour" != cuda ]; then  # cpu or cu126: PyTorch's own index, the same versions
  reqs=.venv/requirements-$flavour.txt
  pip_args=(--extra-index-url "https://download.pytorch.org/whl/$flavour" --requirement "$reqs")
  size="size not measured here"; first="not measured here"; key="$want $flavour"
else
  reqs=requirements.txt
  pip_args=(--requirement "$reqs")
  size="about 5.4 GB"; first="about 2.5 min on 2 idle cores with a fast network; much longer on a busy machine"; key=$want
fi
say "step 3/4: install $n pinned packages from $reqs into $PWD/.venv ($size; the first time took $first)"
# A disk that fills up halfway leaves pip's OSError and a half-made .venv: say so before starting.
free_kb=$(df -Pk . 2>/dev/null | awk 'NR == 2 {print $4}')
if [ "$flavour" = cuda ] && [ -n "$free_kb" ] && [ "$free_kb" -lt $(( 6 * 1024 * 1024 )) ]; then
  echo "error: the CUDA build needs about 6 GB free (5.4 GB installed, and pip's unpacking); the disk of $PWD has $(( free_kb / 1024 / 1024 )) GB free: free some space there, or install the CPU-only build (tools/setup_env.sh --cpu)" >&2
  exit 1
fi
say "  pip's own output goes to $PWD/$LOG"
if [ $dry = 1 ]; then
  say "  would run: $python -m venv .venv && .venv/bin/python -m pip install ${pip_args[*]}"
  say "step 4/4: would check that torch, torchvision and Lightning import, and the GPU driver against torch's CUDA"
  say "then: tools/build_horovod.sh (lesson 05's Horovod, built once)"
  exit 0
fi
start=$SECONDS
"$python" -m venv .venv
[ "$flavour" != cuda ] && "$python" tools/setup_choice.py requirements "$flavour" > "$reqs"
if ! .venv/bin/python -m pip install --progress-bar off "${pip_args[@]}" > "$LOG" 2>&1; then
  line=$(grep -m1 -E '^ERROR:' "$LOG" || tail -1 "$LOG")
  echo "error: pip could not install $reqs: $line (pip's full output: $LOG)" >&2
  exit 1
fi
say "  done in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s; .venv now takes $(du -sh .venv/ | cut -f1)"

say "step 4/4: check that the packages load, and the GPU driver against torch's CUDA"
.venv/bin/python - <<'PY'
# The pairing that must hold: torchvision loads beside this torch, and Lightning imports.
import torch, torchvision, pytorch_lightning
print(f"setup:   torch {torch.__version__}, torchvision {torchvision.__version__}, Lightning {pytorch_lightning.__version__}")
PY
(cd scripts && ../.venv/bin/python -m trainup.devices | sed 's/^/setup:   /')  # the driver, the GPU's age, bf16
echo "$key" > .venv/.requirements.sha256
course
tools/build_horovod.sh  # lesson 05's Horovod, built from source against this torch (a few minutes, once)
