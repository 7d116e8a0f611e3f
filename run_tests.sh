#!/usr/bin/env bash
# README command 2: set up, then run the tests (unit tests, real runs of the scripts on tiny data, and
# nbval over every notebook in quick mode). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
tools/setup_env.sh
# TRAINUP_START_SLURM: the SLURM lesson may start (and, as root, install) a local SLURM for its jobs.
export TRAINUP_QUICK=1 TRAINUP_START_SLURM=1
exec .venv/bin/python -m pytest "$@"
