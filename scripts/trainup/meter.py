"""The sums of one epoch (loss, correct predictions, samples), on its own: the log, the stop and the
collectives all use it, and it needs none of them."""
import torch


def whole(t):
    """A tensor cut over processes (a DTensor: tensor parallelism's class scores, cut by class)
    gathered whole on every rank (a collective: every rank calls it); any other as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class Meter:
    """Sums of loss, correct predictions and samples over an epoch."""
    def __init__(self):
        self.loss, self.correct, self.samples = 0.0, 0, 0

    def add(self, loss, logits, labels):
        loss, logits, n = whole(loss), whole(logits), labels.numel()
        if loss.device.type == "cpu":
            self.loss += loss.item() * n
            self.correct += (logits.argmax(1) == labels).sum().item()
        else:  # sums stay on the GPU: .item() would make the CPU wait for the GPU at every step
            self.loss += loss.detach().double() * n
            self.correct += (logits.argmax(1) == labels).sum()
        self.samples += n

    def as_tensor(self):
        """The sums as one tensor, to add up across processes (all_reduce)."""
        return torch.tensor([float(self.loss), float(self.correct), self.samples], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t):
        m = cls()
        m.loss, m.correct, m.samples = t[0].item(), int(t[1].item()), int(t[2].item())
        return m

    @property
    def mean_loss(self):
        return float(self.loss) / max(self.samples, 1)

    @property
    def accuracy(self):
        return float(self.correct) / max(self.samples, 1)


def steady_rate(epochs):
    """The course's one throughput: samples a second in steady state, over the epochs after the
    first (the first pays for start-up: the loader's workers, allocations, kernels chosen; lesson 02
    shows it on its own). A run of one epoch has only that one. None without epochs."""
    steady = [e for e in epochs if e.get("wall_s")]
    steady = steady[1:] or steady
    wall = sum(e["wall_s"] for e in steady)
    return sum(e["samples"] for e in steady) / wall if wall else None
