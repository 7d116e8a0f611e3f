#!/usr/bin/env bash
# Store a notebook's outputs (what a learner reads before running anything, and what nbval compares
# its tagged cells against): executes each notebook given (default: all) in place, from its own
# folder, with full-length runs; TRAINUP_QUICK=1 stores quick runs instead. The notebook's opening
# then says which (tools/stored_notebook.py). Only on a quiet machine: it waits for the load average
# to fall to the cores (the course's one threshold, lessons/claims.py), and refuses if it does not.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRAINUP_QUICK=${TRAINUP_QUICK:-0}
WAIT_S=${TRAINUP_STORE_WAIT_S:-300}  # a notebook just stored leaves its own load: it decays in minutes
cores=$(nproc)
LOADAVG=${TRAINUP_LOADAVG_FILE:-/proc/loadavg}  # another file: tests/test_stored_outputs.py
load() { cut -d' ' -f1 "$LOADAVG"; }
quiet() { awk -v l="$(load)" -v c="$cores" 'BEGIN { exit !(l <= c) }'; }
notebooks=("$@")
[ ${#notebooks[@]} -gt 0 ] || notebooks=(notebooks/[0-9]*.ipynb)
for nb in "${notebooks[@]}"; do
  waited=0
  until quiet; do
    if [ "$waited" -ge "$WAIT_S" ]; then
      echo "error: the load average is $(load) on $cores cores after ${WAIT_S} s of waiting: outputs stored now would time a busy machine; stop what else is running and store again" >&2
      exit 1
    fi
    sleep 10; waited=$((waited + 10))
  done
  start=$(load)
  echo "== $nb (load average $start on $cores cores)"
  .venv/bin/jupyter nbconvert --to notebook --execute --inplace "$nb" \
    --ExecutePreprocessor.timeout=1800 --log-level WARN
  # dead frames out, and the load its stored timings were taken under in (tools/stored_notebook.py)
  .venv/bin/python tools/stored_notebook.py "$nb" "$start" "$(load)" "$cores"
done
