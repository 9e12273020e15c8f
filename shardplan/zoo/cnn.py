"""Convolutional models: AlexNet, VGG-16, ResNet-50 and ResNet-152 as pure-Python graphs.

Each builder mirrors torchvision's model of the same name (NCHW activations, conv weights
[out, in, r, s], nn.Linear weights [out, in]) and ends in a cross-entropy loss against an int
input `labels` of shape (batch,). Parameter names follow torchvision's state_dict
(`features.0.weight`, `layer1.0.conv1.weight`, `fc.bias`, ...), so a plan can be mapped onto a
torchvision module by name. At the default sizes the parameter counts are torchvision's:
AlexNet 61,100,840, VGG-16 138,357,544, ResNet-50 25,557,032, ResNet-152 60,192,808.

Deviations from torchvision, all of them parameter-free:
- the adaptive average pool before the classifier (AlexNet 6x6, VGG 7x7) is an identity at
  224x224 and is left out; at other image sizes the classifier reads the map size that results;
- a pooling layer whose window does not fit the feature map, or whose input is already 1x1, is
  skipped, so tiny test images (32x32) build instead of shrinking to nothing;
- ResNet's global average pool is `reduce_mean` over the spatial axes (2, 3).

`width` is the channel count of the first stage (64 in the published models); every stage and the
VGG classifier's hidden size (4096 = 64 * width) scale with it, so small versions stay small.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardplan.errors import IRError
from shardplan.ir.graph import Graph, GraphBuilder
from shardplan.zoo.layers import dense

# -- layer helpers -------------------------------------------------------------------------------


def _conv(b: GraphBuilder, x: str, out_channels: int, kernel: int, name: str, stride: int = 1,
          padding: int = 0, bias: bool = True) -> str:
    """nn.Conv2d: weight [out, in, k, k] (+ bias [out], added along the channel axis)."""
    in_channels = b.shape(x)[1]
    with b.scope(name):
        w = b.param("weight", (out_channels, in_channels, kernel, kernel))
        y = b.apply("conv2d", x, w, stride=stride, padding=padding, name="conv")
        if bias:
            y = b.apply("bias_add", y, b.param("bias", (out_channels,)), axis=1, name="bias_add")
    return y


def _batch_norm(b: GraphBuilder, x: str, name: str) -> str:
    """nn.BatchNorm2d: learnable gamma/beta [c] (running statistics are buffers, not params)."""
    channels = b.shape(x)[1]
    with b.scope(name):
        gamma = b.param("weight", (channels,))
        beta = b.param("bias", (channels,))
        return b.apply("batch_norm", x, gamma, beta, name="norm")


def _pool(b: GraphBuilder, x: str, kernel: int, stride: int, name: str, padding: int = 0,
          mode: str = "max") -> str:
    """Max/avg pooling; skipped (identity) when the map is 1x1 or smaller than the window."""
    height, width = b.shape(x)[2:]
    if (height == 1 and width == 1) or min(height, width) + 2 * padding < kernel:
        return x
    return b.apply("pool2d", x, kernel=kernel, stride=stride, padding=padding, mode=mode,
                   name=name)


def _flatten(b: GraphBuilder, x: str) -> str:
    """torch.flatten(x, 1): [n, c, h, w] -> [n, c*h*w] (a refinable reshape, no data movement)."""
    n, c, h, w = b.shape(x)
    return b.apply("reshape", x, shape=(n, c * h * w), name="flatten")


def _classifier(b: GraphBuilder, x: str, layout: str, hidden: int, classes: int) -> str:
    """torchvision's AlexNet/VGG head, one letter per Sequential entry of `layout`:
    D = Dropout(0.5), L = Linear (hidden, hidden, then classes), R = ReLU.

    Entries are named by their index so parameter names match torchvision's state_dict.
    """
    linears = 0
    with b.scope("classifier"):
        for index, layer in enumerate(layout):
            if layer == "D":
                x = b.apply("dropout", x, p=0.5, name=f"{index}.dropout")
            elif layer == "R":
                x = b.apply("relu", x, name=f"{index}.relu")
            else:
                linears += 1
                x = dense(b, x, hidden if linears < 3 else classes, str(index))
    return x


def _inputs(b: GraphBuilder, batch: int, image: int) -> tuple[str, str]:
    if batch < 1 or image < 1:
        raise IRError(f"model {b.name!r}: batch {batch} and image {image} must be >= 1")
    pixels = b.input("pixels", (batch, 3, image, image))
    labels = b.input("labels", (batch,), dtype_bytes=4)
    return pixels, labels


def _check_width(name: str, width: int, multiple: int = 1) -> None:
    if width < 1 or width % multiple:
        raise IRError(f"model {name!r}: width {width} must be a positive multiple of {multiple}")


# -- AlexNet and VGG -----------------------------------------------------------------------------


def alexnet(batch: int = 32, image: int = 224, classes: int = 1000,
            name: str = "alexnet") -> Graph:
    """AlexNet as in torchvision (one-tower, 64-192-384-256-256 channels, 4096-4096 head).

    At 224x224 the last feature map is 256x6x6, so the classifier reads 9216 features.
    Images smaller than 7x7 are too small for the first 11x11/4 convolution.
    """
    b = GraphBuilder(name)
    x, labels = _inputs(b, batch, image)
    # (out channels, kernel, stride, padding, max-pool after)
    layers = ((64, 11, 4, 2, True), (192, 5, 1, 2, True), (384, 3, 1, 1, False),
              (256, 3, 1, 1, False), (256, 3, 1, 1, True))
    index = 0
    with b.scope("features"):
        for out_channels, kernel, stride, padding, pool in layers:
            x = _conv(b, x, out_channels, kernel, str(index), stride, padding)
            x = b.apply("relu", x, name=f"{index + 1}.relu")
            index += 2
            if pool:
                x = _pool(b, x, 3, 2, f"{index}.pool")
                index += 1
    x = _flatten(b, x)
    logits = _classifier(b, x, "DLRDLRL", 4096, classes)
    b.apply("cross_entropy", logits, labels, name="loss")
    return b.build()


def _vgg(config: Sequence[int | str], batch: int, image: int, classes: int, width: int,
         name: str) -> Graph:
    """VGG: 3x3 convs (padding 1, with bias) + ReLU, 2x2 max pools at 'M', a 3-layer head."""
    _check_width(name, width)
    b = GraphBuilder(name)
    x, labels = _inputs(b, batch, image)
    index = 0
    with b.scope("features"):
        for item in config:
            if item == "M":
                x = _pool(b, x, 2, 2, f"{index}.pool")
                index += 1
                continue
            x = _conv(b, x, int(item) * width // 64, 3, str(index), padding=1)
            x = b.apply("relu", x, name=f"{index + 1}.relu")
            index += 2
    x = _flatten(b, x)
    logits = _classifier(b, x, "LRDLRDL", 64 * width, classes)
    b.apply("cross_entropy", logits, labels, name="loss")
    return b.build()


_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(batch: int = 32, image: int = 224, classes: int = 1000, width: int = 64,
          name: str = "vgg16") -> Graph:
    """VGG-16 (configuration D, no batch norm): 13 convs, 5 max pools, 4096-4096 head.

    At 224x224 the last feature map is 512x7x7 (25088 classifier inputs).
    """
    return _vgg(_VGG16, batch, image, classes, width, name)


# -- ResNet --------------------------------------------------------------------------------------


def _bottleneck(b: GraphBuilder, x: str, planes: int, stride: int, name: str) -> str:
    """torchvision Bottleneck (v1.5: the stride sits on the 3x3 conv), expansion 4."""
    in_channels = b.shape(x)[1]
    out_channels = 4 * planes
    with b.scope(name):
        y = _batch_norm(b, _conv(b, x, planes, 1, "conv1", bias=False), "bn1")
        y = b.apply("relu", y, name="relu1")
        y = _conv(b, y, planes, 3, "conv2", stride=stride, padding=1, bias=False)
        y = b.apply("relu", _batch_norm(b, y, "bn2"), name="relu2")
        y = _batch_norm(b, _conv(b, y, out_channels, 1, "conv3", bias=False), "bn3")
        shortcut = x
        if stride != 1 or in_channels != out_channels:
            shortcut = _conv(b, x, out_channels, 1, "downsample.0", stride=stride, bias=False)
            shortcut = _batch_norm(b, shortcut, "downsample.1")
        y = b.apply("add", y, shortcut, name="residual")
        return b.apply("relu", y, name="relu3")


def _resnet(blocks: Sequence[int], batch: int, image: int, classes: int, width: int,
            name: str) -> Graph:
    """Stem (7x7/2 conv, BN, ReLU, 3x3/2 max pool), four bottleneck stages, global mean, fc."""
    _check_width(name, width)
    b = GraphBuilder(name)
    x, labels = _inputs(b, batch, image)
    x = _batch_norm(b, _conv(b, x, width, 7, "conv1", stride=2, padding=3, bias=False), "bn1")
    x = b.apply("relu", x, name="relu")
    x = _pool(b, x, 3, 2, "maxpool", padding=1)
    for stage, count in enumerate(blocks):
        planes = width * 2 ** stage
        with b.scope(f"layer{stage + 1}"):
            for i in range(count):
                stride = 2 if i == 0 and stage > 0 else 1
                x = _bottleneck(b, x, planes, stride, str(i))
    x = b.apply("reduce_mean", x, axes=(2, 3), name="avgpool")
    logits = dense(b, x, classes, "fc")
    b.apply("cross_entropy", logits, labels, name="loss")
    return b.build()


def resnet50(batch: int = 32, image: int = 224, classes: int = 1000, width: int = 64,
             name: str = "resnet50") -> Graph:
    """ResNet-50: bottleneck stages of 3, 4, 6, 3 blocks (2048 features at width 64)."""
    return _resnet((3, 4, 6, 3), batch, image, classes, width, name)


def resnet152(batch: int = 32, image: int = 224, classes: int = 1000, width: int = 64,
              name: str = "resnet152") -> Graph:
    """ResNet-152: bottleneck stages of 3, 8, 36, 3 blocks (2048 features at width 64)."""
    return _resnet((3, 8, 36, 3), batch, image, classes, width, name)


__all__ = ["alexnet", "resnet152", "resnet50", "vgg16"]
