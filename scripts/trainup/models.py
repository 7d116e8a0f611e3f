"""Models: the pytorch/examples MNIST CNN (the default) and torchvision's ResNets."""
import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("cnn", "cnn_bn", "resnet18", "resnet50")


class Net(nn.Module):
    """pytorch/examples' MNIST CNN, sized from the input shape so it also takes CIFAR-10."""
    def __init__(self, shape=(1, 28, 28), num_classes=10, dropout=0.25):
        super().__init__()
        c, h, w = shape
        self.conv1 = nn.Conv2d(c, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(2 * dropout)
        self.fc1 = nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return self.fc2(x)  # logits: F.cross_entropy applies the log-softmax


class NetBN(Net):
    """The same CNN with a BatchNorm after each convolution. Its statistics come from the batch, so under
    DDP they depend on how the batch is split over the processes (lesson 04a2: SyncBatchNorm)."""
    def __init__(self, shape=(1, 28, 28), num_classes=10, dropout=0.25):
        super().__init__(shape, num_classes, dropout)
        self.bn1, self.bn2 = nn.BatchNorm2d(32), nn.BatchNorm2d(64)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return self.fc2(x)


def build(args, dataset):
    """The model args ask for, shaped for dataset; the same seed gives the same weights."""
    torch.manual_seed(args.seed)
    if args.model in ("cnn", "cnn_bn"):
        return (Net if args.model == "cnn" else NetBN)(dataset.shape, dataset.num_classes, args.dropout)
    import torchvision  # imported only here: it adds seconds to every start
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=dataset.num_classes)
    if dataset.shape[0] != 3:  # grey images: a first layer that takes one channel
        model.conv1 = nn.Conv2d(dataset.shape[0], 64, 7, 2, 3, bias=False)
    return model


class Block(nn.Module):
    """One residual MLP block (pre-norm): the identical unit a pipeline cuts the model between."""
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + F.relu(self.fc(self.norm(x)))


class BlockStack(nn.Module):
    """Flatten, a linear stem, `blocks` identical Blocks, a linear head: deep enough to cut into stages."""
    def __init__(self, shape=(1, 28, 28), num_classes=10, blocks=8, width=256):
        super().__init__()
        self.stem = nn.Linear(shape[0] * shape[1] * shape[2], width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(blocks)))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x.flatten(1))))


class FeedForward(nn.Module):
    """A transformer's MLP block (pre-norm, residual): width -> hidden -> width. Tensor parallelism cuts
    `up` by its output features and `down` by its input features (Megatron-LM), so each process computes
    its slice of the hidden layer and one all-reduce sums the slices' contributions."""
    def __init__(self, width, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(F.relu(self.up(self.norm(x))))


class FeedForwardStack(nn.Module):
    """Flatten, a linear stem, `blocks` FeedForward blocks, a linear head: the tensor-parallel lesson's model."""
    def __init__(self, shape=(1, 28, 28), num_classes=10, blocks=2, width=64, hidden=256):
        super().__init__()
        self.stem = nn.Linear(shape[0] * shape[1] * shape[2], width)
        self.blocks = nn.Sequential(*(FeedForward(width, hidden) for _ in range(blocks)))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x.flatten(1))))
