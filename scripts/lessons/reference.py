"""Lesson 11: a reference set of this machine's runs, the ones lesson 11's model predicts.

    cd scripts && python -m lessons.reference          # into logs/reference/<host>_<YYYY-MM-DD>/

Made on a quiet machine, one job after another (two jobs side by side would time each other):
lesson 04's DDP script on 1 and 2 processes, the sharding script's ZeRO stages on 1 and 2 (on the
block stack 256 wide, and 1024 wide), the same jobs at 8 samples a rank on 2 processes and on 1
(COMM: what a step communicates, measured in steps), and lesson 04a1's sweep of each collective, so
the model's alpha and beta come from the same machine and day. Each job's runs follow one another
(job_runs): the runs a prediction compares are minutes apart, not a quarter of an hour.
The 1-process runs are made at the global batch (the scaling report's strong-scaling baseline)
and at the per-rank batch (the compute a rank of 2 does: lessons/bylesson/predict_here.py). Those
at the per-rank batch are made twice at once, on purpose (BESIDE): a rank of 2 computes while the
other computes on the other core, and the two share the memory and the caches; alone, a process
has them to itself (they are made alone too, to show what that costs). Only logs are kept (the
checkpoints go to a temporary folder); machine.json says where, when and under what load.
"""
import argparse
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainup import LOG_DIR, ROOT
from trainup.metrics import machine_load

from . import checks, jobs, launch
from .log_reader import read_run
from .report import failed

REFERENCE_DIR = LOG_DIR / "reference"
BATCH = 64  # the global batch of every training run; a rank of 2 takes 32
EPOCHS = 4  # the first is not timed by the model (warm-up; the sharding script's counted step)
CPU = ["--device", "cpu", "--threads", 1, "--epochs", EPOCHS]  # one thread a process: a core each
STAGES = ("none", "optimizer", "gradients", "parameters")  # DDP, ZeRO-1, ZeRO-2, ZeRO-3
BLOCKS = ["--blocks", 4, "--width", 256, "--shard", ",".join(STAGES)]  # lesson 09's stack, wider
# the same stack 4 times wider (16 times the bytes, the same calls): there the bytes a step moves
# outweigh its calls' fixed costs, as on a cluster's large models; at 256 the calls do
WIDE = ["--blocks", 4, "--width", 1024, "--shard", ",".join(STAGES)]
SIZES = "1K,4K,16K,64K,256K,1M,4M,16M"  # lesson 04's sweep, past the largest gradient here
ROUNDS = 10  # the sweep 10 times over (about 15 s): each call's latency averaged over moments
OPS = "all_reduce,broadcast,all_gather,reduce_scatter"  # every op the ZeRO stages run, timed apart
# A step's communication, measured in steps (lessons/bylesson/predict_here.py): the sweep times one
# call at a time between idle ranks; a step makes its calls between computations, through DDP's or
# FSDP's own code, and a call costs more the more a rank computed before it. COMM_BATCH samples
# a rank a step (a quarter of the predicted runs' 32), COMM_SAMPLES a rank an epoch (64 steps).
COMM_BATCH, COMM_SAMPLES = 8, 512
COMM_JOBS = ("ref_ddp", "ref_fsdp", "ref_wide")  # the jobs whose 2-process runs are predicted
# (name, script, processes, flags); a sharding job with several --shard modes names each run
# <name>_<mode>.


def job_runs(job, script, flags, baseline=None):
    """One predicted job's runs, one after another so that a prediction's inputs are minutes
    apart (a shared machine's speed drifts over a quarter of an hour): its COMM pair, its
    per-rank run (made beside a copy: BESIDE), the 2-process run predicted, the per-rank run
    alone; before them the 1-process run at the global batch (baseline flags), where wanted."""
    first = [(f"{job}_n1", script, 1, [*CPU, *baseline, "--batch-size", BATCH])] \
        if baseline is not None else []
    # the job's collectives as its steps make them (COMM): 8 samples a rank, on 2 processes
    # and on 1 (made beside a copy, as a rank computes), so the two differ by what the step
    # communicates
    comm = [(f"{job}_n{n}_comm", script, n, [*CPU, *flags, "--batch-size", n * COMM_BATCH,
                                             "--train-size", n * COMM_SAMPLES]) for n in (2, 1)]
    return first + comm + [
        (f"{job}_n1_b32", script, 1, [*CPU, *flags, "--batch-size", BATCH // 2]),
        (f"{job}_n2", script, 2, [*CPU, *flags, "--batch-size", BATCH]),
        # once more, alone: what sharing the machine costs (predict_here)
        (f"{job}_n1_b32_alone", script, 1, [*CPU, *flags, "--batch-size", BATCH // 2])]


RUNS = (
    ("ref_bandwidth", "_trainup_collectives.py", 2, ["--show", "bandwidth", "--ops", OPS,
                                                     "--sizes", SIZES, "--rounds", ROUNDS]),
    *job_runs("ref_ddp", "_trainup_ddp.py", [], baseline=[]),
    *job_runs("ref_fsdp", "_trainup_fsdp.py", BLOCKS, baseline=[*BLOCKS[:4], "--shard", "none"]),
    *job_runs("ref_wide", "_trainup_fsdp.py", WIDE),
)
# the per-rank runs, each made beside a copy of itself (<name>_beside): what a rank computes
# while another rank computes next to it
BESIDE = ("ref_ddp_n1_b32", "ref_fsdp_n1_b32", "ref_wide_n1_b32", "ref_ddp_n1_comm",
          "ref_fsdp_n1_comm", "ref_wide_n1_comm")


def variant(name, tag):
    """A per-rank run's other run: its copy made beside it (tag "beside") or the same run made
    alone ("alone"); a mode's run <job>_<mode> has <job>_<tag>_<mode>. None for any other run."""
    for job in BESIDE:
        rest = name[len(job):] if name.startswith(job) else None
        if rest == "" or (rest and rest[1:] in STAGES):
            return f"{job}_{tag}{rest}"
    return None


def beside(name):
    return variant(name, "beside")


def alone(name):
    return variant(name, "alone")


def comm(name):
    """A predicted 2-process run's COMM pair, (its job on 2 processes, on 1) at COMM_BATCH samples
    a rank, a mode's <job>_n2_comm_<mode> (the 1-process run has its copy: beside); None for any
    other run."""
    for job in COMM_JOBS:
        rest = name[len(job) + 3:] if name.startswith(f"{job}_n2") else None
        if rest == "" or (rest and rest[1:] in STAGES):
            return f"{job}_n2_comm{rest}", f"{job}_n1_comm{rest}"
    return None


def names(name, script, flags, copies=True):
    """The runs one job makes: one per --shard mode of a sharding job of several; and those of
    the copy made beside it (BESIDE), unless copies is False."""
    flags = [str(f) for f in flags]
    modes = flags[flags.index("--shard") + 1].split(",") if "--shard" in flags else []
    runs = [f"{name}_{m}" for m in modes] if len(modes) > 1 else [name]
    return runs + ([beside(r) for r in runs] if copies and name in BESIDE else [])


def command(name, script, nproc, flags, folder, checkpoints):
    """(argv, the command as printed): python for one process, torchrun for several; from the
    course's top folder, as every job of the lessons."""
    part = [f"scripts/{script}", *map(str, flags), "--run-name", name, "--log-dir",
            os.path.relpath(folder, ROOT), "--no-progress"]
    if script != "_trainup_collectives.py":  # the collectives save no checkpoint
        part += ["--checkpoint-dir", str(checkpoints)]
    if nproc == 1:
        return [sys.executable, *part], "$ python " + shlex.join(part)
    flags = launch.torchrun_flags(nproc=nproc)
    return launch.TORCHRUN + flags + part, launch.shown(flags, part)


def cpu_model():
    """The processor's name as /proc/cpuinfo gives it (elsewhere, what Python knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host():
    """This machine's name, as a plain file name."""
    return "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())


def label(day=None):
    """<host>_<YYYY-MM-DD>: the folder's name, which the reports show as measured_on."""
    return f"{host()}_{day or datetime.date.today().isoformat()}"


def make(folder=None, runs=RUNS, say=print):
    """Every run of RUNS into folder, one after another, each checked finished and in the
    schema; then machine.json. Returns the folder."""
    folder = Path(folder or REFERENCE_DIR / label())
    folder.mkdir(parents=True, exist_ok=True)
    load_before, cores = machine_load()
    busy_before, ours_before, tick = busy_cpu_s(), own_cpu_s(), time.monotonic()
    commands, speed = [], []
    with tempfile.TemporaryDirectory(prefix="trainup_reference_") as checkpoints:
        for name, script, nproc, flags in runs:
            speed.append(round(speed_probe(), 4))
            argv, shown = command(name, script, nproc, flags, folder, checkpoints)
            copy = None
            if name in BESIDE:  # its copy starts first, and runs all the while (see BESIDE)
                argv_b, shown_b = command(beside(name), script, nproc, flags, folder, checkpoints)
                shown = f"{shown_b} & {shown[2:]}; wait"
                copy = subprocess.Popen(argv_b, cwd=ROOT, env=launch.environment(),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
            say(shown)
            proc = jobs.run(argv, timeout=1800, env=launch.environment())
            if copy is not None:
                out, _ = copy.communicate(timeout=1800)
                if copy.returncode != 0:
                    raise failed(beside(name), out[-2000:], copy.returncode)
            if proc.returncode != 0:
                raise failed(name, proc.stdout[-1000:] + proc.stderr, proc.returncode)
            for run in names(name, script, flags):
                checks.finished(run, folder)
            commands.append(shown[2:].replace(checkpoints, TEMPORARY))
        relative_paths(folder, checkpoints)
    speed.append(round(speed_probe(), 4))
    load_after, _ = machine_load()
    others = (busy_cpu_s() - busy_before - (own_cpu_s() - ours_before)
              if busy_before is not None else None)
    wall = time.monotonic() - tick
    shutil.rmtree(folder / "tensorboard", ignore_errors=True)  # the logs hold the same scalars
    about = dict(machine=host(), cpu=cpu_model(), cores=cores,
                 date=datetime.date.today().isoformat(), load_before=load_before,
                 load_after=load_after, wall_s=round(wall, 1),
                others_cpu_s=None if others is None else round(others, 1), speed_s=speed,
                command="cd scripts && python -m lessons.reference",
                 runs=commands)
    (folder / "machine.json").write_text(json.dumps(about, indent=1) + "\n")
    say(f"{folder}: {len(list(folder.glob('*.jsonl')))} logs; load average {load_before} before, "
        f"{load_after} after, on {cores} cores")
    moved = steady(dict(speed_s=speed))
    if moved > STEADY:  # the host slowed it: said, and shown by describe (notebook 11 prints it)
        say(f"This machine's own speed moved by {moved:.0%} while the set was made (the speed "
            f"probe before each job: {min(speed):.3f} to {max(speed):.3f} s), with no program of "
            f"its own busy: runs minutes apart may differ by as much.")
    if not quiet(folder):  # notebook 11 asserts its goal on a quiet set only
        say(f"The load average was {load_before:.1f} before, and other programs than the set's "
            f"used {others:.0f} s of CPU time of the {wall * cores:.0f} its {wall:.0f} s had on "
            f"{cores} cores: they took turns with these runs. Stop them and make the set again "
            f"before committing it." if others is not None else
            f"The load average was {load_before:.1f} before and up to {max(loads(folder)):.1f} "
            f"on {cores} cores: other programs took turns with these runs. Stop them and make "
            f"the set again before committing it.")
    return folder


def complete(folder):
    """The folder holds this lesson's set: a machine.json and every run of RUNS."""
    want = [n for name, script, _, flags in RUNS for n in names(name, script, flags)]
    folder = Path(folder)
    return (folder / "machine.json").exists() and all((folder / f"{n}.jsonl").exists()
                                                      for n in want)


def newest(reference_dir=REFERENCE_DIR):
    """The newest folder of logs/reference/ that holds this lesson's set, by its date; None where
    there is none."""
    found = [f for f in Path(reference_dir).glob("*_*") if f.is_dir() and complete(f)]
    return max(found, key=lambda f: (f.name.rsplit("_", 1)[1], f.name), default=None)


def about(folder):
    """machine.json: the machine, the date, the load before and after, the commands."""
    return json.loads((Path(folder) / "machine.json").read_text())


def describe(folder):
    """One line: where and when the set was made, and how quiet the machine was."""
    info = about(folder)
    line = (f"{Path(folder).name}: {info['cpu']}, {info['cores']} cores, load average at most "
            f"{max(loads(folder)):.2f} while the set was made (its own 2-process jobs in it)")
    if info.get("others_cpu_s") is not None:  # a CPU time below 0 is no one's: see own_cpu_s
        line += (f"; other programs than its jobs: {max(info['others_cpu_s'], 0):.0f} "
                 f"s of CPU time of the cores' {info['wall_s'] * info['cores']:.0f}")
    if steady(info) is not None:
        line += f"; its speed, probed before each job, moved by {steady(info):.0%} at most"
    return line


def loads(folder):
    """Every one-minute load average the set recorded: before and after it, and at each run's
    start and end (its log's env and summary)."""
    info = about(folder)
    seen = [info["load_before"], info["load_after"]]
    for path in sorted(Path(folder).glob("*.jsonl")):
        run = read_run(path)
        seen += [(run["env"] or {}).get("load_start"), (run["summary"] or {}).get("load_end")]
    return [v for v in seen if v is not None]


TEMPORARY = "<a temporary folder>"  # where the set's checkpoints went, deleted with it


def relative_paths(folder, checkpoints=None):
    """No path of this machine in the logs: the course's folder left out (the config's data_dir),
    the temporary checkpoint folder named as such (--checkpoint-dir, the summary's checkpoint). A
    set is committed, and this machine's paths mean nothing on another."""
    top = json.dumps(str(ROOT))[1:-1] + "/"  # as JSON writes it
    for path in Path(folder).glob("*.jsonl"):
        text = path.read_text().replace(f'"{top}', '"')
        if checkpoints:
            text = text.replace(json.dumps(str(checkpoints))[1:-1], TEMPORARY)
        path.write_text(text)


OTHERS = 0.05  # the most of the cores' time that other programs may take while the set is made
STEADY = 0.10  # the speed probe's movement (slowest over fastest) above which make says so


def busy_cpu_s():
    """Seconds the machine's cores have run programs since it started (/proc/stat: user, nice,
    system, irq and softirq; not idle, iowait, or steal, another machine's); None without /proc."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(ticks[i] for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")


# others_cpu_s may come out a few seconds below 0: a job's CPU time counts the moments the
# hypervisor took its core (steal, left out of busy_cpu_s). At or below 0, no one else ran.


def own_cpu_s():
    """Seconds of CPU time of this process and of the jobs it has waited for (torchrun waits for its
    workers, so theirs are in it)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def speed_probe(rounds=3):
    """Seconds of a fixed computation on one thread (200 products of 512 x 512 float32 matrices,
    about 0.3 s), the best of rounds: timed before each job of the set and after the last. A
    shared machine (a virtual machine's host) can slow by tens of percent for minutes while no
    program here uses the CPU: its load and CPU times do not show it, this does."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a = torch.ones(512, 512)
    best = math.inf
    for _ in range(rounds):
        tick = time.perf_counter()
        for _ in range(200):
            torch.mm(a, a)
        best = min(best, time.perf_counter() - tick)
    torch.set_num_threads(threads)
    return best


def steady(info):
    """(the speed probe's slowest over its fastest, less 1): how far the machine's own speed moved
    while the set was made; None for a set made before the probe."""
    probe = info.get("speed_s")
    return max(probe) / min(probe) - 1 if probe else None


def quiet(folder):
    """Nothing else took turns with the runs: the machine idle when the set began (a load average
    below half its cores), and, while it was made, other programs than the set's own jobs used
    at most OTHERS of the cores' time (the machine's busy time against the jobs' own CPU time).
    A set made where that cannot be counted (no /proc/stat) is judged by its load averages
    instead: none above the cores plus a half (the set's own 2-process jobs bring the load near
    the cores; the half is torchrun's agent and start-ups). The speed probe (steady) is not in
    it: on a shared host it moves by tens of percent while this machine is idle; describe and
    make say how far."""
    info = about(folder)
    if info["load_before"] >= info["cores"] / 2:
        return False
    if info.get("others_cpu_s") is not None:
        return info["others_cpu_s"] <= OTHERS * info["wall_s"] * info["cores"]
    return max(loads(folder)) <= info["cores"] + 0.5


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m lessons.reference",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", default=None, help="default: logs/reference/<host>_<date>")
    p.add_argument("--replace", action="store_true", help="empty the folder first")
    a = p.parse_args(argv)
    folder = Path(a.folder or REFERENCE_DIR / label())
    if a.replace and folder.exists():
        shutil.rmtree(folder)
    make(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
