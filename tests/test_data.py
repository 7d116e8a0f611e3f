"""Data sets and the sampler that makes one process see what N DDP ranks see together."""
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DistributedSampler

from trainup import UserError, data


def args(**kw):
    base = dict(dataset="digits", data_dir="data", download=False, train_size=None, test_size=None,
                image_shape=(1, 28, 28), num_classes=10)
    return SimpleNamespace(**{**base, **kw})


def test_offline_digits_are_real_mnist_shaped_and_balanced():
    train, test = data.load(args())
    assert (len(train), len(test)) == (4000, 1000)
    x, y = train.tensors
    assert x.shape[1:] == (1, 28, 28) and train.shape == (1, 28, 28)
    assert set(y.tolist()) == set(range(10)) and abs(x.mean().item()) < 0.2  # normalised


def test_sizes_trim_the_data():
    train, test = data.load(args(train_size=100, test_size=50))
    assert (len(train), len(test)) == (100, 50)


def test_synthetic_images_take_any_shape_and_repeat_for_an_index():
    train, _ = data.load(args(dataset="synthetic", image_shape=(3, 224, 224), num_classes=1000, train_size=8))
    x, y = train[3]
    assert x.shape == (3, 224, 224) and 0 <= y < 1000 and len(train) == 8
    assert torch.equal(train[3][0], x) and not torch.equal(train[4][0], x)


def test_tiny_mnist_idx_files_load_through_torchvision(tmp_path):
    data.write_mnist_idx(tmp_path, train_size=40, test_size=20)
    train, test = data.load(args(dataset="mnist", data_dir=str(tmp_path)))
    assert (len(train), len(test)) == (40, 20) and train.shape == (1, 28, 28)


def test_missing_data_folder_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        data.load(args(dataset="mnist", data_dir=str(tmp_path / "nope")))


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
        together = sorted(i for s in shards for i in s[k * batch // world:(k + 1) * batch // world])
        assert together == sorted(whole[k * batch:(k + 1) * batch])
