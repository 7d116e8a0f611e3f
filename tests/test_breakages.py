"""The check of the checks: each deliberate breakage of the course must make its matching test fail.

For each breakage, scripts/ is copied to a scratch folder, ONE small textual patch is applied to the copy
(the patch must apply exactly once, so a rewritten script cannot silently make a breakage a no-op), and
the cheapest test that guards that claim runs in a fresh pytest against the copy (conftest honours
TRAINUP_SCRIPTS_DIR). The test must fail, by an assertion, not by an error. Nothing in scripts/ carries a
test-only switch for this. The fresh pytests (forks of one interpreter that imported pytest and torch
once: PYTESTS) run side by side, as many at a time as this process has cores: one that trains beside one
that does not. Under pytest-xdist the suite's controller starts them as soon as a worker
has collected, beside the rest of the suite (early_run); the module, last, reads what they did.
Each target must pass on the unbroken course: the suite runs this module last (conftest) and reads how its
targets did; run alone, it runs them unbroken first.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import ROOT, run_cache
from suite_plugin import EARLY_BREAKAGES, OUTCOMES, SHARED_OUTCOMES, plain_id, shared_outcomes

# (what breaks, file under scripts/, text to replace, its replacement, the test that must fail)
BREAKAGES = {
    "all-reduce sums instead of averaging": (
        "_trainup_ddp.py",
        '    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # all-reduces gradients\n',
        '    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # all-reduces gradients\n'
        "    model.register_comm_hook(None, lambda _, bucket: torch.distributed.all_reduce(\n"
        "        bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0]))  # SUM, not divided\n",
        "test_ddp.py::test_two_ranks_with_half_the_batch_end_like_one_process_with_all_of_it",
    ),
    "resume ignored": (
        "_trainup_cpu.py",
        "start_epoch = checkpoint.load(ckpt, model, optimizer, scheduler) if args.resume else 1",
        "start_epoch = 1",
        "test_cpu_script.py::test_resume_runs_only_the_missing_epochs_and_ends_like_a_straight_run",
    ),
    "non-atomic save": (
        "trainup/checkpoint.py",
        '                    "args": plain(args)}, tmp)\n        os.replace(tmp, path)\n    return path\n',
        '                    "args": plain(args)}, path)\n    return path\n',
        "test_metrics.py::test_a_checkpoint_being_written_never_replaces_the_last_good_one_until_it_is_whole",
    ),
    "every rank writes the checkpoint": (
        "_trainup_ddp.py",
        "        if ctx.is_main:  # one writer",
        "        if True:  # one writer",
        "test_ddp.py::test_only_rank_0_writes_the_checkpoint_and_always_through_a_rename",
    ),
    "normalisation removed": (
        "trainup/data.py",
        "x, y = _normalize(x, (MNIST_MEAN,), (MNIST_STD,))[order], y[order]",
        "x, y = x[order], y[order]",
        "test_data.py::test_digits_are_normalised_with_mnists_mean_and_std",
    ),
    "Hogwild workers on private copies": (
        "_trainup_hogwild.py",
        "    torch.set_num_threads(args.threads)\n    sampler = data.ShuffleSampler(len(train_set), args.seed, rank,",
        '    torch.set_num_threads(args.threads)\n    model = __import__("copy").deepcopy(model)\n'
        "    sampler = data.ShuffleSampler(len(train_set), args.seed, rank,",
        "test_cpu_script.py::test_two_hogwild_processes_train_one_shared_model",
    ),
    "resume ignores where inside the epoch the run stopped": (
        "trainup/preempt.py",
        'self.skip = position["step"] if position else 0',
        "self.skip = 0",
        "test_preemption.py::test_resume_goes_on_from_the_step_and_ends_like_a_run_never_stopped",
    ),
    "a log record with a wrong type": (
        "trainup/metrics.py",
        "line = dict(epoch=epoch, loss=train.mean_loss,",
        "line = dict(epoch=str(epoch), loss=train.mean_loss,",
        "test_metrics.py::test_every_record_follows_the_schema",
    ),
    "Horovod sums the gradients instead of averaging": (
        "_trainup_horovod.py",
        "compression=compression, op=hvd.Average)",
        "compression=compression, op=hvd.Sum)",
        "test_horovod.py::test_two_horovod_ranks_with_half_the_batch_end_like_one_process_with_all_of_it",
    ),
    "Lightning seeds each rank differently": (
        "_trainup_lightning.py",
        "pl.seed_everything(args.seed + 1, verbose=False)",
        "pl.seed_everything(args.seed + 1 + int(__import__('os').environ.get('LOCAL_RANK', 0)), verbose=False)",
        "test_lightning.py::test_lightning_ddp_on_two_processes_ends_like_one_process",
    ),
    "Fabric's loader shuffles from epoch 0 (seeded without the first epoch)": (
        "_trainup_fabric.py",
        "fabric.seed_everything(args.seed + start_epoch, verbose=False)",
        "fabric.seed_everything(args.seed, verbose=False)",
        "test_fabric.py::test_fabric_on_two_processes_ends_like_one_process_and_so_does_a_resumed_run",
    ),
    "ZeRO-2's reduce-scatter not divided by the world size": (
        "trainup/parallel/sharding.py",
        "piece.grad = mine[:piece.numel()].div_(self.world)",
        "piece.grad = mine[:piece.numel()]",
        "test_fsdp.py::test_every_mode_ends_with_the_parameters_of_one_process",
    ),
    "Horovod without the initial broadcast": (
        "_trainup_horovod.py",
        "    hvd.broadcast_parameters(model.state_dict(), root_rank=0)"
        "  # every rank starts as rank 0,\n"
        "    hvd.broadcast_optimizer_state(optimizer, root_rank=0)"
        "  # whatever it initialised or loaded\n",
        "",
        "test_horovod.py::test_ranks_that_start_apart_end_like_one_process_after_rank_0s_broadcast",
    ),
    "the manual pipeline sends zeros back instead of the activations' gradient": (
        "_trainup_pipeline_manual.py",
        "    dist.send(act.grad, dst=0)",
        "    dist.send(torch.zeros_like(act.grad), dst=0)",
        "test_pipeline.py::test_the_manual_halves_learn_step_by_step_what_the_whole_model_learns_in_one_process",
    ),
    "the bus bandwidth without the ring factor": (
        "_trainup_collectives.py",
        "busbw_gbps=algbw * bus, ring_factor=bus)",
        "busbw_gbps=algbw, ring_factor=bus)",
        "test_ddp_inside.py::test_bus_bandwidth_is_algbw_times_the_ring_factor",
    ),
    # each cp rank's gradient is its tokens' share of one loss: FSDP must sum the shares over cp
    # and average over dp (divide by dp); its default averages over all dp x cp processes
    "the 4-D job's FSDP averages the cp ranks' shares instead of summing them": (
        "trainup/parallel/four_d.py",
        "module.set_gradient_divide_factor(float(dims.dp))",
        "module.set_gradient_divide_factor(float(dims.dp * dims.cp))",
        "test_four_d.py::test_the_job_ends_with_the_parameters_of_one_process[fourd_dp2cp2]",
    ),
    "the planner counts fp32 training as the ZeRO paper's fp16 recipe": (
        "lessons/bylesson/planner.py",
        'PER_PARAM = {"32": FP32_ADAM, "bf16": FSDP2_BF16, "16": MIXED_ADAM}',
        'PER_PARAM = {"32": MIXED_ADAM, "bf16": FSDP2_BF16, "16": MIXED_ADAM}',
        "test_simulated_world.py::"
        "test_the_planners_states_are_fsdpmemtrackers_within_10_percent[8]",
    ),
}


# the breakages whose test trains (seconds of jobs), each followed by one whose test runs in its
# own process
TRAINS = (
    "all-reduce sums instead of averaging",
    "resume ignored",
    "every rank writes the checkpoint",
    "Hogwild workers on private copies",
    "Horovod sums the gradients instead of averaging",
    "Lightning seeds each rank differently",
    "Fabric's loader shuffles from epoch 0 (seeded without the first epoch)",
    "ZeRO-2's reduce-scatter not divided by the world size",
    "Horovod without the initial broadcast",
    "the manual pipeline sends zeros back instead of the activations' gradient",
    "the bus bandwidth without the ring factor",
    "the 4-D job's FSDP averages the cp ranks' shares instead of summing them",
)
_rest = [n for n in BREAKAGES if n not in TRAINS]
ORDER = [n for pair in zip(TRAINS, _rest + [None] * len(TRAINS)) for n in pair if n]


def broken_copy(name, folder):
    """scripts/ copied into folder with the one breakage applied; None when it no longer applies."""
    file, old, new, _ = BREAKAGES[name]
    copy = folder / "scripts"
    shutil.copytree(ROOT / "scripts", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "data").symlink_to(
        ROOT / "data"
    )  # the offline digits' cache, as beside the real scripts/
    text = (copy / file).read_text()
    if text.count(old) != 1:
        return None
    (copy / file).write_text(text.replace(old, new))
    return copy


# The breakages' pytests are forks of one interpreter that has imported pytest and torch, as each
# of them does first (its test module imports torch): paid once, not by each.
# Nothing of the course is imported before the forks: each fork's conftest reads its copy's
# TRAINUP_SCRIPTS_DIR and imports that copy's trainup and lessons, as a fresh pytest does. At most
# `most` run at once; one still running after its timeout is killed, as subprocess.run kills it.
PYTESTS = r"""
import json, os, signal, sys, time
import pytest
import torch  # noqa: F401
runs, most = json.loads(sys.argv[1]), int(sys.argv[2])
running = {}


def reap():
    while True:
        for pid, (run, deadline) in list(running.items()):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            run, deadline = running.pop(pid)
            late = time.monotonic() > deadline
            print(json.dumps([run["name"], os.waitstatus_to_exitcode(status), late]), flush=True)
            return
        time.sleep(0.1)


for run in runs:
    while len(running) >= most:
        reap()
    pid = os.fork()
    if pid == 0:
        for fd, path in ((1, run["out"]), (2, run["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.environ.update(run["env"])
        code = pytest.main(run["args"])
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(int(code))
    running[pid] = run, time.monotonic() + run["timeout"]
while running:
    reap()
"""
PYTEST_FLAGS = [
    "-q",
    "-p",
    "no:cacheprovider",
    "-p",
    "no:nbval",
    "-p",
    "no:anyio",
    "-o",
    "addopts=",
]


def run_their_tests(copies, most, timeout=600):
    """Each breakage's test (-x) in a pytest of its own against its broken copy, forked from
    PYTESTS: name -> its CompletedProcess, or its TimeoutExpired where it did not end in time."""
    runs = [
        dict(
            name=name,
            args=[
                *PYTEST_FLAGS,
                "--basetemp",
                str(copy.parent / "tmp"),
                "-x",
                f"tests/{BREAKAGES[name][3]}",
            ],
            env={"TRAINUP_SCRIPTS_DIR": str(copy)},
            out=str(copy.parent / "pytest.out"),
            err=str(copy.parent / "pytest.err"),
            timeout=timeout,
        )
        for name, copy in copies.items()
    ]
    if not runs:
        return {}
    cmd = [sys.executable, "-c", PYTESTS, json.dumps(runs), str(most)]
    zygote = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert zygote.returncode == 0, zygote.stderr[-3000:]
    out = {}
    for line in zygote.stdout.splitlines():
        name, code, late = json.loads(line)
        run = next(r for r in runs if r["name"] == name)
        if late:
            out[name] = subprocess.TimeoutExpired(run["args"], timeout)
        else:
            out[name] = subprocess.CompletedProcess(
                run["args"], code, Path(run["out"]).read_text(), Path(run["err"]).read_text()
            )
    assert out.keys() == copies.keys(), zygote.stdout
    return out


def pytest_of(targets, scripts, basetemp, timeout=600):
    """A fresh pytest of these test ids against that scripts/ folder (no notebook plugin: no notebook)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST_FLAGS, "--basetemp", str(basetemp), *targets],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TRAINUP_SCRIPTS_DIR": str(scripts)},
    )


def unbroken(targets, basetemp, scripts=ROOT / "scripts"):
    """The targets on the unbroken course, in one pytest: the failures' ids (a breakage's test that fails
    anyway proves nothing about the breakage)."""
    proc = pytest_of(["-rf", *targets], scripts, basetemp, timeout=900)
    failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.M)
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not failed):
        failed.append(
            f"the pytest itself (exit {proc.returncode}): {proc.stdout[-1500:]}{proc.stderr[-1500:]}"
        )
    return failed


def failing_unbroken(targets, basetemp, session=OUTCOMES, elsewhere=(), read=dict, ids=None):
    """The targets that fail on the unbroken course: as this session ran them, where it did (conftest
    runs this module last), and from a pytest of the others (this module run alone, or with -k).
    elsewhere: the targets another xdist worker runs in this session; their outcomes are awaited
    (outcomes_elsewhere). ids: a target's test ids in the session (a parametrized test's, one per
    parameter: session_ids); a target ran where every one did, and failed where one did."""
    if os.environ.get("TRAINUP_SCRIPTS_DIR"):
        session, elsewhere = {}, ()
    ids = ids or {}

    def outcome(t, seen):
        of = [seen.get(i) for i in ids.get(t, [t])]
        return None if None in of else "failed" if "failed" in of else "passed"

    ran = {t: outcome(t, session) for t in targets if outcome(t, session)}
    waited = [i for t in targets if t in elsewhere and t not in ran for i in ids.get(t, [t])]
    seen = {**session, **outcomes_elsewhere(waited, read)}
    ran.update({t: outcome(t, seen) for t in targets if t in elsewhere and outcome(t, seen)})
    missing = [t for t in targets if t not in ran]
    return [t for t, outcome in ran.items() if outcome == "failed"] + (
        unbroken(missing, basetemp) if missing else []
    )


def session_ids(targets, here):
    """Each target's test ids among the session's: itself, or a parametrized test's every
    parameter ("tests/test_fsdp.py::test_x" -> "...::test_x[none]", ...); [] where it has none."""
    return {
        t: [i for i in here if i == t or (i.startswith(f"{t}[") and i.endswith("]"))]
        for t in targets
    }


ELSEWHERE_WAIT_S = 1800  # far beyond the longest module: reaching it means a worker died


def outcomes_elsewhere(targets, read, poll_s=2.0):
    """How another xdist worker's run of these targets ended, waited for: the breakages are the last
    work handed out, so every target is already running or queued on a worker that will report it."""
    deadline = time.monotonic() + ELSEWHERE_WAIT_S
    while True:
        seen = read()
        if all(t in seen for t in targets) or time.monotonic() > deadline:
            return {t: seen[t] for t in targets if t in seen}
        time.sleep(poll_s)


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def run_breakages(names, folder_for, most):
    """Each named breakage (in ORDER): its broken copy in a folder of folder_for() (None where it
    no longer applies) and what its test's pytest did."""
    copies = {name: broken_copy(name, folder_for()) for name in ORDER if name in names}
    procs = run_their_tests({name: copy for name, copy in copies.items() if copy}, most)
    return {name: (copy, procs.get(name)) for name, copy in copies.items()}


# Under pytest-xdist the breakages' pytests need not wait for the module's turn: they only run the
# copies. The controller starts them in a process of their own (this file run as a script,
# early_run) as soon as the workers have collected (suite_plugin.start_breakages), so that they
# share the cores with the rest of the suite instead of ending it alone; this module, last, reads
# what they did (early_outcomes) and checks the targets on the unbroken course as before.
def early_run(out, names):
    """Run the breakages named and write what each did to out (JSON, whole or not at all)."""
    base = out.parent / "breakages"
    base.mkdir(parents=True, exist_ok=True)
    folders = (base / f"broken{i}" for i in range(len(BREAKAGES)))
    made = {}
    try:
        runs = run_breakages(set(names), lambda: next(folders), cores())
        for name, (copy, proc) in runs.items():
            late = isinstance(proc, subprocess.TimeoutExpired)
            made[name] = dict(
                copy=copy and str(copy),
                late=late,
                timeout=proc.timeout if late else None,
                returncode=None if late or proc is None else proc.returncode,
                stdout=getattr(proc, "stdout", "") or "",
                stderr=getattr(proc, "stderr", "") or "",
            )
    finally:  # what was made, or nothing (the module then runs the rest itself)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(made))
        os.replace(tmp, out)


def early_outcomes(config, names, poll_s=2.0):
    """The controller's early run of these breakages, waited for while it runs: name -> (copy,
    its pytest's CompletedProcess or TimeoutExpired); {} where none was started or it ended
    without a word (the module runs those itself)."""
    path = getattr(config, "workerinput", {}).get(EARLY_BREAKAGES)
    pid = Path(f"{path}.pid") if path else None
    if not pid or not pid.exists():
        return {}
    out, deadline = Path(path), time.monotonic() + ELSEWHERE_WAIT_S
    while not out.exists() and alive(int(pid.read_text())) and time.monotonic() < deadline:
        time.sleep(poll_s)
    if not out.exists():
        return {}
    made = {}
    for name, r in json.loads(out.read_text()).items():
        if name in names:
            copy = r["copy"] and Path(r["copy"])
            proc = (
                subprocess.TimeoutExpired("pytest", r["timeout"])
                if r["late"]
                else None
                if r["returncode"] is None
                else subprocess.CompletedProcess(
                    "pytest", r["returncode"], r["stdout"], r["stderr"]
                )
            )
            made[name] = (copy, proc)
    return made


def alive(pid):
    """Whether that process runs (a zombie, ended and not yet collected, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, request):
    """Each selected breakage (-k works): its broken copy (None if it no longer applies) and what its test's
    pytest did."""
    assert sorted(ORDER) == sorted(BREAKAGES)
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_the_breakage_makes_its_test_fail"
    }
    run_cache(tmp_path_factory)  # the pytests below inherit it: a copy that leaves a run's code
    # alone reuses the run
    targets = sorted({f"tests/{BREAKAGES[name][3]}" for name in selected})
    # beside the breakages' pytests, cores at a time: the unbroken check, which mostly waits (for
    # the other xdist worker)
    with ThreadPoolExecutor(max_workers=1) as pool:
        here = {plain_id(item.nodeid) for item in request.session.items}  # each worker collects all
        ids = {t: found for t, found in session_ids(targets, here).items() if found}
        xdist = SHARED_OUTCOMES in getattr(request.config, "workerinput", {})
        elsewhere = {t for t in ids if not all(i in OUTCOMES for i in ids[t])} if xdist else set()
        clean = pool.submit(
            failing_unbroken,
            targets,
            tmp_path_factory.mktemp("unbroken"),
            OUTCOMES,
            elsewhere,
            lambda: shared_outcomes(request.config),
            ids,
        )
        made = early_outcomes(request.config, selected)
        made.update(
            run_breakages(
                selected - made.keys(), lambda: tmp_path_factory.mktemp("broken"), max(1, cores())
            )
        )
        failing = clean.result()
        return {
            name: (
                copy,
                proc,
                [f for f in failing if f.endswith(BREAKAGES[name][3]) or BREAKAGES[name][3] in f],
            )
            for name, (copy, proc) in made.items()
        }


@pytest.mark.parametrize("name", BREAKAGES)
def test_the_breakage_makes_its_test_fail(name, outcomes):
    file, _, _, test = BREAKAGES[name]
    copy, proc, failing_unbroken = outcomes[name]
    assert not failing_unbroken, (
        f"{test} fails on the unbroken course too: its failure says nothing of {name!r}"
    )
    assert copy is not None, f"the breakage {name!r} no longer applies to scripts/{file}: update it"
    assert not isinstance(proc, subprocess.TimeoutExpired), (
        f"with {name!r}, {test} did not end in {proc.timeout} s"
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]
    assert (
        proc.returncode == 1 and re.search(r"\b1 failed\b", summary) and "error" not in summary
    ), f"with {name!r}, {test} did not fail as it must: {summary}\n{proc.stdout[-3000:]}"


def test_a_target_that_fails_on_the_unbroken_course_is_reported(tmp_path):
    """The precondition itself: a target that fails without any breakage is named."""
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "test_fails_anyway.py").write_text(
        "def test_it():\n    assert 1 == 2\n\n\ndef test_fine():\n    pass\n"
    )
    targets = [
        str(folder / "test_fails_anyway.py::test_it"),
        str(folder / "test_fails_anyway.py::test_fine"),
    ]
    failed = unbroken(targets, tmp_path / "tmp")
    assert len(failed) == 1 and failed[0].endswith("test_fails_anyway.py::test_it"), failed
    assert unbroken(targets[1:], tmp_path / "tmp2") == []
    # as the whole suite sees it: this session's outcome where it ran the target, a pytest where it
    # did not
    assert (
        failing_unbroken(targets, tmp_path / "tmp3", session={targets[0]: "failed"}) == targets[:1]
    )
    assert failing_unbroken(targets, tmp_path / "tmp4", session={targets[0]: "passed"}) == []
    assert failing_unbroken(targets, tmp_path / "tmp5", session={})[0].endswith(
        "test_fails_anyway.py::test_it"
    )
    # under xdist: another worker's outcome, awaited, where that worker runs the target
    later = iter([{}, {targets[0]: "failed"}])
    one = targets[:1]
    assert failing_unbroken(one, tmp_path / "tmp6", {}, set(one), lambda: next(later)) == one
    assert failing_unbroken(one, tmp_path / "tmp7", {}, set(one), lambda: {one[0]: "passed"}) == []


def test_a_parametrized_target_is_read_from_its_parameters_outcomes(tmp_path):
    """A target named without its parameters (test_fsdp's every mode) is each of its parameters'
    tests in the session: read from their outcomes, not run again in a pytest of its own."""
    target = "tests/test_x.py::test_mode"
    here = {f"{target}[none]", f"{target}[zero2]", "tests/test_x.py::test_model", target + "_b"}
    ids = session_ids([target], here)
    assert sorted(ids[target]) == [f"{target}[none]", f"{target}[zero2]"]
    passed = {i: "passed" for i in ids[target]}
    # a pytest of the target itself would fail (no such file): [] means none ran
    assert failing_unbroken([target], tmp_path / "a", passed, ids=ids) == []
    one_failed = {**passed, f"{target}[zero2]": "failed"}
    assert failing_unbroken([target], tmp_path / "b", one_failed, ids=ids) == [target]
    later = iter([{}, passed])  # under xdist: another worker's parameters, awaited
    assert failing_unbroken([target], tmp_path / "c", {}, {target}, lambda: next(later), ids) == []


def test_the_controllers_early_run_is_read_back_as_the_module_would_have_made_it(
    tmp_path, monkeypatch
):
    """early_run's file, read by early_outcomes once its process has ended: the same copies and
    results (a finished pytest, one past its timeout, a breakage that no longer applies); a run
    that ended without writing gives {}, so that the module makes them itself."""
    made = {
        "resume ignored": (tmp_path / "a", subprocess.CompletedProcess("x", 1, "1 failed", "")),
        "non-atomic save": (tmp_path / "b", subprocess.TimeoutExpired("x", 600)),
        "normalisation removed": (None, None),
    }
    monkeypatch.setattr(sys.modules[__name__], "run_breakages", lambda names, *_: made)
    out = tmp_path / "breakages.json"
    ended = subprocess.Popen(["true"])
    ended.wait()
    Path(f"{out}.pid").write_text(str(ended.pid))  # ended, collected: no such process
    config = type("Config", (), {"workerinput": {EARLY_BREAKAGES: str(out)}})()
    assert early_outcomes(config, set(made)) == {}
    early_run(out, list(made))
    back = early_outcomes(config, set(made) - {"non-atomic save"})
    assert back.keys() == made.keys() - {"non-atomic save"}
    copy, proc = back["resume ignored"]
    assert copy == tmp_path / "a" and (proc.returncode, proc.stdout) == (1, "1 failed")
    assert back["normalisation removed"] == (None, None)
    late = early_outcomes(config, {"non-atomic save"})["non-atomic save"][1]
    assert isinstance(late, subprocess.TimeoutExpired) and late.timeout == 600
    assert early_outcomes(type("Config", (), {})(), set(made)) == {}  # no xdist: none started


if __name__ == "__main__":  # suite_plugin.start_breakages: tests/test_breakages.py OUT NAME...
    early_run(Path(sys.argv[1]), sys.argv[2:])
