#!/usr/bin/env bash
# README command 2: set up, then run the tests (unit tests, real runs of the scripts on tiny data,
# and nbval over every notebook in quick mode). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
tools/setup_env.sh
# TRAINUP_START_SLURM: the SLURM lesson may start (and, as root, install) a local SLURM for its
# jobs.
export TRAINUP_QUICK=1 TRAINUP_START_SLURM=1
# The workers keep more threads busy than there are cores: torch's OpenMP threads, waiting for
# work, sleep instead of spinning (libgomp's OMP_WAIT_POLICY). Measured 2026-11-25 on 2 loaded
# cores: a two-thread quick run took 6.4 CPU-seconds instead of 7.4, in no more time. The sums
# (and so every result) are the same; the learner's own runs keep the default.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# The float64 proof runs allocate blocks of tens of MB every step (a test batch of 1000 in float64):
# glibc maps each from the kernel and unmaps it on free, so every step faults its pages in again,
# zeroed. Measured 2026-11-25: a quick float64 run took 8.4 CPU-seconds, 2.6 of them in the kernel;
# with freed memory kept for reuse, 7.2 and 0.9 (resident memory about 15 % higher). Where memory
# comes from changes no sum; float32 runs, with smaller blocks, are unchanged.
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-1000000000}
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-1000000000}
# One pytest-xdist worker more than the cores (at least 2, at most 4): a worker waits at times (a
# rendezvous, SLURM's scheduler, Ray's start) and another's jobs take the core. Measured from fresh
# clones on 2 cores, 2026-11-25: with 2 workers 5.6 % of the CPU time was idle and the tests took
# 21.3 minutes; with 3, 1.7 % and 20.2. Each file runs whole on one worker (its fixtures' jobs run
# once); the notebooks run as two units, each in order, side by side at the start
# (tests/conftest.py: serial_group).
# TRAINUP_TEST_WORKERS=0 runs everything in this one process.
cores=$(nproc 2>/dev/null || echo 2)
workers=${TRAINUP_TEST_WORKERS:-$(( cores + 1 < 2 ? 2 : (cores + 1 > 4 ? 4 : cores + 1) ))}
exec .venv/bin/python -m pytest -n "$workers" --no-loadscope-reorder "$@"
