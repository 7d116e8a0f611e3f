"""The figures of lessons 11 and 11a1: this machine's alpha-beta fit, predictions beside what was
published, and the what-if curves. Each is saved to images/<name>.png and returned closed: end
the cell with it."""
from ..report import save


def _closed(fig, name):
    import matplotlib.pyplot as plt

    save(fig, name)
    plt.close(fig)
    return fig


def jsc(two, three, steps=None, name="predict_jsc"):
    """Published minutes against GPUs, and the fits' predictions (the fitted runs marked): two
    runs with the excess on each epoch's start, the same on each step (steps), three runs."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.loglog(two["gpus"], two["published_min"], "ko", label="published (JSC, 2023)")
    fits = [(two, "s--", "fitted on 1 and 4 GPUs, epochs' starts"),
            (steps, "x-.", "fitted on 1 and 4 GPUs, on each step"),
            (three, "^:", "fitted on 1, 4 and 16 GPUs")]
    for table, style, label in [f for f in fits if f[0] is not None]:
        line, = ax.loglog(table["gpus"], table["predicted_min"], style, label=label)
        fitted = table[table["fitted"]]
        ax.loglog(fitted["gpus"], fitted["predicted_min"], "o", mfc="none", ms=12,
                  color=line.get_color())
    ax.set(xlabel="GPUs", ylabel="minutes (10 epochs of ResNet-50 on ImageNet)",
           title="The model against the supercomputer course's published runs\n"
                 "(circled: the runs a fit saw)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return _closed(fig, name)


def what_if(table, name="predict_what_if"):
    """Minutes, efficiency and cost against GPUs, one line per machine."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for node, rows in table.groupby("node", sort=False):
        for ax, column in zip(axes, ("minutes", "efficiency", "cost")):
            ax.plot(rows["gpus"], rows[column], "o-", label=node)
    for ax, label in zip(axes, ("minutes to train", "efficiency", "cost at the price above")):
        ax.set(xscale="log", xlabel="GPUs", ylabel=label)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize="small")
    fig.suptitle("What if: the fitted ResNet-50 job on more GPUs and other networks (predicted)")
    return _closed(fig, name)


def alpha_beta(table, name="predict_alpha_beta"):
    """This machine's all-reduce times and the alpha-beta line through two of them."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.loglog(table["size_bytes"], table["time_s"], "ko", label="measured (lesson 04's sweep)")
    ax.loglog(table["size_bytes"], table["predicted_s"], "-", label="the ring's alpha-beta line")
    ax.set(xlabel="message (bytes)", ylabel="all-reduce (s)", title="This machine's all-reduce")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return _closed(fig, name)
