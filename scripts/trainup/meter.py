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
