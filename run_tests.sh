#!/usr/bin/env bash
# README command 2: set up, then run the full test suite (unit tests, real runs of the scripts on tiny
# data under their real launchers, nbval over every notebook in quick mode, the breakages). This is
# what CI runs. Extra arguments go to pytest: `bash run_tests.sh -m fast` runs the fast tier
# (tests/README.md).
set -euo pipefail
cd "$(dirname "$0")"
tools/setup_env.sh
# TRAINUP_START_SLURM: the SLURM lesson may start (and, as root, install) a local SLURM for its
# jobs.
export TRAINUP_QUICK=1 TRAINUP_START_SLURM=1
# The suite keeps more threads busy than there are cores: OpenMP threads waiting for work sleep
# instead of spinning (libgomp's OMP_WAIT_POLICY), which frees the cores for the other jobs. The
# sums, and so every result, are the same; the learner's own runs keep the default.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# The float64 proof runs allocate blocks of tens of MB every step: glibc would map each from the
# kernel and unmap it on free, faulting its pages in again every step. Keeping freed memory for
# reuse changes where memory comes from, never a sum.
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-1000000000}
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-1000000000}
# One pytest-xdist worker more than the cores (at least 2, at most 4): a worker waits at times (a
# rendezvous, SLURM's scheduler, Ray's start) and another's jobs take the core. Each test file runs
# whole on one worker (its fixtures' jobs run once); the notebooks run as three units, each in order
# (tests/suite_plugin.py: serial_group). TRAINUP_TEST_WORKERS=0 runs everything in this process.
cores=$(nproc 2>/dev/null || echo 2)
workers=${TRAINUP_TEST_WORKERS:-$(( cores + 1 < 2 ? 2 : (cores + 1 > 4 ? 4 : cores + 1) ))}
# --durations: the slowest tests' times end the report, to see where the suite's time goes.
exec .venv/bin/python -m pytest -n "$workers" --no-loadscope-reorder --durations=25 "$@"
