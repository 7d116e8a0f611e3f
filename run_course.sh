#!/usr/bin/env bash
# README command 1: set up, then run every lesson this machine can run, in quick mode, by executing
# each notebook (which runs its scripts and draws its plots). The tracked notebooks are not modified:
# the executed copies go to results/notebooks/.
set -euo pipefail
cd "$(dirname "$0")"
tools/setup_env.sh
export TRAINUP_QUICK=${TRAINUP_QUICK:-1}
mkdir -p results/notebooks
for nb in notebooks/[0-9]*.ipynb; do
  echo "== $nb"
  .venv/bin/jupyter nbconvert --to notebook --execute "$nb" --output-dir results/notebooks \
    --ExecutePreprocessor.timeout=3600 --log-level WARN
done
cat <<MSG

Done. What this run left:
  results/notebooks/  the notebooks, executed on this machine (open them in JupyterLab)
  logs/               one <run>.jsonl (metrics, schema in logs/README.md) and <run>.stdout per run
  images/             the plots
MSG
