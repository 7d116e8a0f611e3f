#!/usr/bin/env bash
# README command 1: set up, then run every lesson this machine can run, in quick mode, by executing
# each notebook (which runs its scripts and draws its plots). The tracked notebooks are not modified:
# the executed copies go to results/notebooks/. A notebook that fails does not stop the others: its copy
# keeps the cells run up to the failing one; the run ends with a summary and exit status 1.
set -euo pipefail
cd "$(dirname "$0")"
tools/setup_env.sh
export TRAINUP_QUICK=${TRAINUP_QUICK:-1}
status=0
.venv/bin/python tools/run_notebooks.py --output-dir results/notebooks notebooks/[0-9]*.ipynb || status=$?
cat <<MSG

Done. What this run left:
  results/notebooks/  the notebooks, executed on this machine (open them in JupyterLab)
  logs/               one <run>.jsonl (metrics, schema in logs/README.md) and <run>.stdout per run
  images/             the plots
MSG
exit $status
