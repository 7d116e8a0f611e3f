#!/usr/bin/env bash
# JupyterLab on the course's notebooks, from the course's top folder, as a user or as root.
# Jupyter Server refuses to start as root (Docker, many cloud machines) unless given --allow-root,
# so it is added for uid 0 only. Extra arguments go to `jupyter lab`, e.g. --no-browser --port 8889.
#
#   bash tools/lab.sh                    full-length runs (what a learner's run of a lesson is)
#   TRAINUP_QUICK=1 bash tools/lab.sh    short runs (512 samples, 2 epochs), as the tests run them
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/jupyter ]; then
  echo "error: no .venv/bin/jupyter here: set the course up first (bash run_course.sh, or tools/setup_env.sh)" >&2
  exit 2
fi
args=(lab notebooks/)
if [ "$(id -u)" = 0 ]; then
  args+=(--allow-root)
fi
exec .venv/bin/jupyter "${args[@]}" "$@"
