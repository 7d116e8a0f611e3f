#!/usr/bin/env bash
# Create .venv with the pinned packages of requirements.txt: once, and again when that file changes.
# The first time downloads torch and friends (a few GB, a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat .venv/.requirements.sha256 2>/dev/null)" = "$want" ]; then
  exec tools/build_horovod.sh  # lesson 05's Horovod: built once, then reused (TRAINUP_SKIP_HOROVOD=1 skips it)
fi
python=${PYTHON:-python3}
"$python" -c 'import sys; assert (3, 10) <= sys.version_info[:2] <= (3, 13), "trainup needs Python 3.10 to 3.13"' \
  || { echo "error: $($python --version 2>&1) found; set PYTHON to a Python 3.10 to 3.13" >&2; exit 2; }
echo "Setting up .venv from requirements.txt (the first time takes a few minutes)..."
"$python" -m venv .venv
.venv/bin/python -m pip install --quiet --requirement requirements.txt
.venv/bin/python - <<'PY'
# The pairing that must hold: torchvision loads beside this torch, and Lightning imports.
import torch, torchvision, pytorch_lightning
print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, Lightning {pytorch_lightning.__version__}")
PY
(cd scripts && ../.venv/bin/python -m trainup.devices)  # one sentence if a GPU here is too old for this CUDA build
echo "$want" > .venv/.requirements.sha256
tools/build_horovod.sh  # lesson 05's Horovod, built from source against this torch (a few minutes, once)
