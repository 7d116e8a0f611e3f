"""Lessons 07 to 07c (PyTorch Lightning): what Lightning took over from the plain DDP script, read
from the scripts and the runs' logs; the 1.x flags answered by the script itself; sync_dist on and
off; TensorBoard read back.

    from lessons.bylesson import lightning
    lightning.who_does_what()              # each distributed chore: where _trainup_ddp.py does it, if Lightning's script does
    lightning.setup("l_ddp")               # what the Trainer chose: strategy, launcher, processes, sampler
    lightning.in_this_kernel(main, "--strategy", "ddp_notebook", ..., name="l_notebook")  # a cell's Trainer
    lightning.old_flags(main)              # the 1.x flags, run through the script: exit status and its sentence
    lightning.sync_table(["l_ddp", "l_nosync"])  # what rank 0 logged against the whole job's loss
    lightning.tensorboard_scalars("l_ddp") # the event file read back (tensorboard's EventAccumulator)
"""
import contextlib
import io
import math
import re
from pathlib import Path

from trainup import CHECKPOINT_DIR, LOG_DIR, ROOT

from .. import report
from ..log_reader import records
from ..report import read_run

SCRIPT = "_trainup_lightning.py"
PLAIN = "_trainup_ddp.py"
# The distributed chores of lesson 04, each with the code that does it by hand (a regular expression).
CHORES = {
    "join the process group": r"distributed\.setup\(|init_process_group",
    "a DistributedSampler": r"DistributedSampler\(",
    "sampler.set_epoch each epoch": r"\.set_epoch\(",
    "wrap the model in DDP": r"\bDDP\(|DistributedDataParallel\(",
    "the batch split over the ranks": r"batch_size // ctx\.world_size|// self\.trainer\.world_size",
    "metrics summed over the ranks": r"distributed\.reduce\(|all_reduce\(",
    "rank 0 alone logs and checkpoints": r"ctx\.is_main",
    "mixed precision (autocast, GradScaler)": r"devices\.autocast\(|GradScaler\(",
    "leave the group together": r"distributed\.cleanup\(|destroy_process_group",
}


def _lines(script, pattern):
    text = (ROOT / "scripts" / script).read_text().splitlines()
    return [n for n, line in enumerate(text, 1) if re.search(pattern, line.split("#")[0])]


def who_does_what():
    """A table: each chore, the lines of the plain DDP script that do it, and those of the Lightning script
    (empty: Lightning's Trainer does it). Read from the two scripts' code, so it cannot drift from them."""
    import pandas as pd
    rows = []
    for chore, pattern in CHORES.items():
        plain, lit = _lines(PLAIN, pattern), _lines(SCRIPT, pattern)
        rows.append({"chore": chore, f"{PLAIN} lines": ", ".join(map(str, plain)) or "-",
                     f"{SCRIPT} lines": ", ".join(map(str, lit)) or "- (the Trainer)"})
    return pd.DataFrame(rows).set_index("chore")


def in_this_kernel(script_main, *flags, name):
    """A script's main() (the notebook imports the script) run inside this Python, a notebook's
    kernel, as a learner's cell would run a Trainer: (its exit status, what it wrote to stderr);
    its log tells the rest. Inside a kernel the Trainer may start its ranks only by forking the
    kernel (strategy ddp_notebook): 'ddp' starts each rank by running the script's file again,
    and a kernel has none (Lightning refuses it)."""
    return _called(script_main, [*map(str, flags), "--run-name", name,
                                 *(["--quick"] if report.QUICK else [])])


def _called(script_main, argv):
    """(exit status, stderr) of script_main(argv) called here; stdout is dropped, since the ranks'
    lines name this machine's folders."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            script_main(argv)
            code = 0
        except SystemExit as e:  # the script's one-sentence refusals
            code = e.code
    return code, err.getvalue()


def mixed_precision(runs, log_dir=LOG_DIR, checkpoint_dir=CHECKPOINT_DIR):
    """Runs of the same flags but --precision, side by side: the precision each Trainer used, the
    dtype of the weights each saved, and each epoch's training loss."""
    import pandas as pd
    import torch
    table = {}
    for name in runs:
        state = torch.load(Path(checkpoint_dir) / f"{name}.pt", map_location="cpu",
                           weights_only=True)["model"]
        dtypes = {str(t.dtype).replace("torch.", "") for t in state.values() if t.is_floating_point()}
        epochs = read_run(Path(log_dir) / f"{name}.jsonl")["epochs"]
        table[name] = {"precision": records(name, "lightning", log_dir)[0]["precision"],
                       "weights saved as": ", ".join(sorted(dtypes)),
                       **{f"loss, epoch {e['epoch']}": e["loss"] for e in epochs}}
    return pd.DataFrame(table)


def setup(name, log_dir=LOG_DIR):
    """What the Trainer chose for a run: its 'lightning' record, with the sampler Lightning put in."""
    s = dict(records(name, "lightning", log_dir)[0])
    s["sampler"] = records(name, "lightning_sync", log_dir)[0]["sampler"]
    s["rank_samples"] = records(name, "lightning_sync", log_dir)[0]["rank_samples"]
    return {k: s[k] for k in ("strategy", "launcher", "accelerator", "precision", "num_nodes", "devices",
                              "world_size", "sampler", "rank_samples", "sync_dist")}


def shard_files(name, checkpoint_dir=None):
    """The files of Lightning's own checkpoint of a ModelParallelStrategy run: a folder, a file of
    shards a rank and DCP's .metadata (written last)."""
    folder = Path(checkpoint_dir or CHECKPOINT_DIR) / f"{name}-lightning.ckpt"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def fabric_setup(name, log_dir=LOG_DIR):
    """What Fabric chose for a run of _trainup_fabric.py: its 'fabric' record."""
    s = records(name, "fabric", log_dir)[0]
    return {k: s[k] for k in ("strategy", "launcher", "accelerator", "precision", "num_nodes", "devices",
                              "world_size", "sampler")}


# The flags of Lightning 1.x tutorials, as they would be passed to this script.
OLD_FLAGS = [["--gpus", "2"], ["--num-processes", "2"], ["--tpu-cores", "8"], ["--strategy", "dp"],
             ["--strategy", "horovod"], ["--strategy", "ddp2"], ["--strategy", "ddp_sharded"]]


def answer(script_main, flags):
    """The script's main() run here with these flags: (exit status, what it wrote on stderr). The
    1.x flags are refused before any training starts, so this takes no time."""
    code, said = _called(script_main, ["--quick", "--no-progress", *flags,
                                       "--run-name", "l_flag_check"])
    return code, said.strip().removeprefix("error: ")


def old_flags(script_main, flags=OLD_FLAGS):
    """A table: each 1.x flag, the script's exit status and its one-sentence answer."""
    import pandas as pd
    rows = []
    for f in flags:
        code, sentence = answer(script_main, f)
        rows.append({"Lightning 1.x": " ".join(f), "exit status": code, "answer": sentence})
    return pd.DataFrame(rows).set_index("Lightning 1.x")


def precision_names():
    """The precision spellings the script takes, and Lightning 2's name for each (from trainup.engines.lightning_compat)."""
    import pandas as pd
    from trainup.engines.lightning_compat import PRECISIONS
    return pd.DataFrame({"--precision": list(PRECISIONS), "Lightning 2 name": list(PRECISIONS.values())}).set_index("--precision")


def sync_table(names, log_dir=LOG_DIR):
    """One row per run and epoch: sync_dist, what self.log reported on rank 0, the whole job's loss, each rank's."""
    import pandas as pd
    rows = []
    for name in names:
        for r in records(name, "lightning_sync", log_dir):
            row = {"run": name, "epoch": r["epoch"], "sync_dist": r["sync_dist"], "logged on rank 0": r["logged_loss"],
                   "whole job": r["job_loss"]}
            row.update({f"rank {i}": v for i, v in enumerate(r["rank_loss"])})
            rows.append(row)
    return pd.DataFrame(rows)


SAME_LOSS = 1e-5  # a logged loss this close to another is that loss (float sums in another order)


def sync_sentence(table):
    """Computed: which runs' logged loss is the job's, and which is rank 0's own."""
    parts = []
    for (name, sync), g in table.groupby(["run", "sync_dist"], sort=False):
        off_job = (g["logged on rank 0"] - g["whole job"]).abs().max()
        off_rank0 = (g["logged on rank 0"] - g["rank 0"]).abs().max()
        what = ("the whole job's loss" if off_job < SAME_LOSS else
                ("rank 0's own shard" if off_rank0 < SAME_LOSS else "neither"))
        # the gap as the claim needs it: below the 1e-5 that tells the two apart, or its order of magnitude
        # above it (its digits depend on the processor's float sums, and nbval compares this sentence)
        gap = f"below {SAME_LOSS:.0e}" if off_job < SAME_LOSS else f"about 1e{math.floor(math.log10(off_job)):+03d}"
        parts.append(f"{name} (sync_dist={sync}) logged {what} (largest gap to the job's loss {gap})")
    return "; ".join(parts) + "."


def sync_plot(names=("l_ddp", "l_torchrun"), name="lightning_sync_dist", log_dir=LOG_DIR):
    """The epoch loss each run logged, read back from its TensorBoard run, against the whole job's loss
    (every rank's sums, from the course's log): with sync_dist the two lines meet; without, rank 0's own."""
    import matplotlib.pyplot as plt
    from ..report import load_epochs, save
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for run in names:
        points = tensorboard_scalars(run, log_dir)["train_loss_epoch"]
        sync = records(run, "lightning_sync", log_dir)[0]["sync_dist"]
        ax.plot(range(1, len(points) + 1), [v for _, v in points], marker="o",
                label=f"{run}, sync_dist={sync}: TensorBoard")
    job = load_epochs(names[0], log_dir)
    ax.plot(job["epoch"], job["loss"], "k--", marker="x", label="the whole job (every rank's sums)")
    ax.set(title="The epoch loss rank 0 logged", xlabel="epoch", ylabel="training loss")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    save(fig, name)
    return fig


def tensorboard_scalars(name, log_dir=LOG_DIR):
    """The scalars of logs/tensorboard/<name> read back: {tag: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(Path(log_dir) / "tensorboard" / name)).Reload()
    return {t: [(s.step, s.value) for s in events.Scalars(t)] for t in events.Tags()["scalars"]}


def callbacks(name, log_dir=LOG_DIR, checkpoint_dir=CHECKPOINT_DIR):
    """What --keep-best, --early-stop and the learning-rate monitor left of run `name`: the epochs
    asked for, each run epoch's test loss (the course's log), the epochs whose checkpoints
    --keep-best kept with the loss in each file's name (counted from 1 as the course counts;
    Lightning names them from 0), and the rate TensorBoard holds for each epoch."""
    run = read_run(Path(log_dir) / f"{name}.jsonl")
    kept = {}
    for path in (Path(checkpoint_dir) / f"{name}-best").glob("*.ckpt"):
        epoch, loss = path.stem.split("-test_loss")  # epoch{e}-test_loss{x:.4f}
        kept[int(epoch[len("epoch"):]) + 1] = float(loss)
    rates = [v for _, v in tensorboard_scalars(name, log_dir)["lr-Adadelta"]]
    args = run["config"]["args"]
    return dict(asked=args["epochs"], losses=[e["test_loss"] for e in run["epochs"]],
                kept=dict(sorted(kept.items())), lr=rates, args=args)
