#!/usr/bin/env bash
# Store a notebook's outputs from a quick run (what nbval compares against): executes each notebook
# given (default: all) in place, in quick mode, from its own folder. Run it on a quiet machine: the
# stored outputs are what a learner reads before running anything.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRAINUP_QUICK=1
notebooks=("$@")
[ ${#notebooks[@]} -gt 0 ] || notebooks=(notebooks/[0-9]*.ipynb)
for nb in "${notebooks[@]}"; do
  echo "== $nb"
  .venv/bin/jupyter nbconvert --to notebook --execute --inplace "$nb" \
    --ExecutePreprocessor.timeout=1800 --log-level WARN
done
