"""torchvision ResNets as ltrain builds them, for the Python-side scripts (baselines, parity)."""
import torch.nn as nn
import torchvision

NUM_CLASSES = 10


def build_model(arch, stem, num_classes=NUM_CLASSES):
    """torchvision `arch` with `num_classes`; the cifar stem is a 3x3 stride-1 conv1 and no max-pool."""
    model = getattr(torchvision.models, arch)(num_classes=num_classes)
    if stem == "cifar":
        model.conv1 = nn.Conv2d(3, model.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return model
