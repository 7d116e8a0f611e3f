"""Solutions to lesson 03's exercises. Run: python notebooks/solutions/03_data_parallel.py"""
from types import SimpleNamespace


def pieces(batch, gpus):
    """Exercise 1: the sizes torch.chunk (and so DataParallel's scatter) gives: ceil(batch / gpus) each,
    the last one what remains; fewer pieces than GPUs when the batch runs out."""
    size = -(-batch // gpus)  # ceiling division
    out = []
    while batch > 0:
        out.append(min(size, batch))
        batch -= size
    return out


def idle_gpus(batch, gpus):
    """How many GPUs get no piece at all."""
    return gpus - len(pieces(batch, gpus))


def replica_mib(model, gpus, shape=(1, 28, 28)):
    """Exercise 2: MiB of parameters DataParallel copies from the first GPU each step (to gpus - 1 others),
    and what a ring all-reduce of the gradients moves per GPU in DDP: 2(N-1)/N of them."""
    import torch.nn as nn  # noqa: F401  (models need torch)
    from trainup import models
    net = models.build(SimpleNamespace(model=model, seed=1, dropout=0.0),
                       SimpleNamespace(shape=shape, num_classes=10))
    mib = sum(p.numel() * p.element_size() for p in net.parameters()) / 2**20
    return dict(model=model, gpus=gpus, params_mib=mib, dp_copy_mib=mib * (gpus - 1),
                ddp_ring_mib_per_gpu=mib * 2 * (gpus - 1) / gpus)


def main():
    import torch
    for batch in range(1, 65):
        for gpus in range(1, 9):
            assert pieces(batch, gpus) == [len(p) for p in torch.arange(batch).chunk(gpus)], (batch, gpus)
    print("pieces() matches torch.chunk for batches 1-64 on 1-8 GPUs; a GPU gets nothing e.g. for",
          [(b, g) for b in range(1, 11) for g in range(2, 5) if idle_gpus(b, g)][:6], "(batch, GPUs)")
    for model in ("cnn", "resnet18"):
        for gpus in (2, 4, 8):
            r = replica_mib(model, gpus)
            print(f"{model} on {gpus} GPUs: DataParallel copies {r['dp_copy_mib']:.1f} MiB of parameters a step; "
                  f"DDP's ring moves {r['ddp_ring_mib_per_gpu']:.1f} MiB of gradients per GPU")


if __name__ == "__main__":
    main()
