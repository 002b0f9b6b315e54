"""torchvision ResNets as ltrain builds them, for the Python-side scripts (baselines, parity)."""
import torch
import torch.nn as nn
import torchvision
from torch.utils.checkpoint import checkpoint_sequential

NUM_CLASSES = 10
# model.arch's values: torchvision's builder names.
ARCHS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "wide_resnet50_2", "wide_resnet101_2",
         "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d")


def build_model(arch, stem, num_classes=NUM_CLASSES):
    """torchvision `arch` with `num_classes`; the cifar stem is a 3x3 stride-1 conv1 and no max-pool."""
    model = getattr(torchvision.models, arch)(num_classes=num_classes)
    if stem == "cifar":
        model.conv1 = nn.Conv2d(3, model.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return model


class SegmentCheckpointed(nn.Module):
    """A torchvision ResNet whose residual blocks run through checkpoint_sequential in training,
    split as ltrain's model.checkpoint_segments splits them: the 16 (ResNet-50) blocks in
    `segments` runs of len // segments, the last run taking the rest and keeping its activations.
    The stem and the head run normally. Parameter names are the wrapped model's under "net.".
    """

    def __init__(self, net, segments):
        super().__init__()
        self.net = net
        self.segments = segments
        self.blocks = nn.Sequential(*[b for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for b in layer])

    def forward(self, x):
        n = self.net
        x = n.maxpool(n.relu(n.bn1(n.conv1(x))))
        if self.training and torch.is_grad_enabled():
            x = checkpoint_sequential(self.blocks, self.segments, x, use_reentrant=False)
        else:
            x = self.blocks(x)
        return n.fc(torch.flatten(n.avgpool(x), 1))
