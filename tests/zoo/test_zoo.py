"""The model zoo: published parameter counts, small builds, CNN structure, registry errors."""

from __future__ import annotations

import re

import pytest

from shardplan.errors import ArgumentError, IRError, UnknownModelError
from shardplan.ir import Role, verify
from shardplan.zoo import MODELS, build, cnn

# every entry with a published count, except GPT-3 175B (built once, in its own test)
PUBLISHED = sorted(n for n, e in MODELS.items()
                   if e.published_params is not None and n != "gpt3-175b")


def test_published_list_covers_the_headline_models():
    assert {"gpt2-small", "bert-base", "resnet50", "vgg16", "alexnet", "resnet152", "gpt2-medium",
            "gpt2-large", "gpt2-xl", "vit-b16"} <= set(PUBLISHED)
    assert MODELS["gpt2-small"].published_params == 124e6
    assert MODELS["bert-base"].published_params == 110e6
    assert MODELS["resnet50"].published_params == 25.6e6
    assert MODELS["vgg16"].published_params == 138.4e6
    assert MODELS["vit-b16"].published_params == 86.6e6


@pytest.mark.parametrize("name", PUBLISHED)
def test_parameter_count_matches_published(name):
    graph = build(name)
    published = MODELS[name].published_params
    assert graph.num_params == pytest.approx(published, rel=0.02), (
        f"{name}: {graph.num_params:,} params vs published {published:,.0f}")


@pytest.mark.parametrize(("name", "exact"), [
    ("alexnet", 61_100_840), ("vgg16", 138_357_544), ("resnet50", 25_557_032),
    ("resnet152", 60_192_808)])
def test_cnn_parameter_counts_equal_torchvision(name, exact):
    assert build(name).num_params == exact


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_builds_small_and_verifies(name):
    graph = build(name, small=True)
    assert verify(graph) is graph
    assert graph.name == name
    assert graph.ops and graph.parameters
    assert graph.flops > 0
    assert all(t.numel >= 1 for t in graph.tensors.values())


def test_gpt3_175b_has_96_layers_of_parameters():
    graph = build("gpt3-175b")
    layers = {m.group(1) for t in graph.parameters if (m := re.match(r"h\.(\d+)\.", t.name))}
    assert layers == {str(i) for i in range(96)}
    hidden = 12288
    per_layer = sum(t.numel for t in graph.parameters if t.name.startswith("h.0."))
    assert per_layer == 12 * hidden**2 + 13 * hidden
    assert graph.num_params == pytest.approx(175e9, rel=0.02)


def test_unknown_model():
    with pytest.raises(UnknownModelError, match=r"no zoo model 'nope'"):
        build("nope")
    with pytest.raises(UnknownModelError, match=r"did you mean 'resnet50'\?"):
        build("resnet5")


def test_unknown_override_is_an_argument_error_naming_the_accepted_ones():
    with pytest.raises(ArgumentError, match=r"model 'resnet50' does not take \[.layers.\]"):
        build("resnet50", small=True, layers=3)


def test_overrides_and_none_values():
    graph = build("resnet50", small=True, batch=3, classes=None)
    assert graph.tensor("pixels").shape == (3, 3, 32, 32)
    assert graph.tensor("fc.weight").shape == (10, 256)


# -- CNN structure -----------------------------------------------------------------------------


def test_cnn_inputs_loss_and_classifier_input_at_default_size():
    alex = cnn.alexnet()
    assert alex.tensor("pixels").shape == (32, 3, 224, 224)
    assert alex.tensor("labels").shape == (32,)
    assert alex.tensor("labels").role is Role.INPUT
    assert alex.tensor("flatten").shape == (32, 256 * 6 * 6)
    assert alex.outputs == ("loss",)
    assert alex.tensor("loss").shape == ()
    assert cnn.vgg16().tensor("flatten").shape == (32, 512 * 7 * 7)
    assert cnn.resnet50().tensor("avgpool").shape == (32, 2048)
    assert cnn.resnet152().tensor("fc.weight").shape == (1000, 2048)


def test_cnn_op_kinds():
    kinds = {op.kind for op in cnn.resnet50(batch=2, image=32, classes=10, width=8).ops}
    assert kinds == {"conv2d", "batch_norm", "relu", "pool2d", "add", "reduce_mean", "linear",
                     "bias_add", "cross_entropy"}
    kinds = {op.kind for op in cnn.vgg16(batch=2, image=32, classes=10, width=8).ops}
    assert kinds == {"conv2d", "bias_add", "relu", "pool2d", "reshape", "dropout", "linear",
                     "cross_entropy"}
    pools = [op for op in cnn.alexnet().ops if op.kind == "pool2d"]
    assert [op.attr("mode") for op in pools] == ["max"] * 3


def test_resnet_structure_and_torchvision_names():
    graph = cnn.resnet50()
    convs = [op for op in graph.ops if op.kind == "conv2d"]
    assert len(convs) == 1 + 3 * 16 + 4  # stem, 16 bottlenecks of 3 convs, 4 downsamples
    assert sum(op.kind == "add" for op in graph.ops) == 16
    assert graph.tensor("layer1.0.conv1.weight").shape == (64, 64, 1, 1)
    assert graph.tensor("layer2.0.conv2.weight").shape == (128, 128, 3, 3)
    assert graph.tensor("layer2.0.downsample.0.weight").shape == (512, 256, 1, 1)
    assert graph.tensor("layer4.2.bn3.bias").shape == (2048,)
    assert graph.op("layer2.0.conv2.conv").attr("stride") == 2  # v1.5: stride on the 3x3
    assert not any(t.name.endswith("conv.bias") for t in graph.parameters)
    assert sum(op.kind == "conv2d" for op in cnn.resnet152().ops) == 1 + 3 * 50 + 4


def test_resnet50_flops_per_image():
    # ~4.1 GMACs per 224x224 image (torchvision's published 4.09 GFLOPS counts MACs)
    graph = cnn.resnet50(batch=1)
    conv_and_fc = sum(op.flops for op in graph.ops if op.kind in ("conv2d", "linear"))
    assert conv_and_fc == pytest.approx(2 * 4.09e9, rel=0.03)


def test_vgg_and_alexnet_names_follow_torchvision():
    vgg = cnn.vgg16()
    assert vgg.tensor("features.28.weight").shape == (512, 512, 3, 3)
    assert vgg.tensor("classifier.0.weight").shape == (4096, 25088)
    assert vgg.tensor("classifier.6.bias").shape == (1000,)
    alex = cnn.alexnet()
    assert alex.tensor("features.3.weight").shape == (192, 64, 5, 5)
    assert alex.tensor("classifier.1.weight").shape == (4096, 9216)
    assert alex.tensor("classifier.6.weight").shape == (1000, 4096)


@pytest.mark.parametrize("image", [7, 16, 32, 64])
def test_alexnet_small_images_skip_pools_that_do_not_fit(image):
    graph = cnn.alexnet(batch=2, image=image, classes=10)
    assert graph.tensor("flatten").shape == (2, 256)
    assert graph.tensor("classifier.6.weight").shape == (10, 4096)


@pytest.mark.parametrize(("image", "pools", "features"),
                         [(1, 0, 64), (4, 2, 64), (32, 5, 64), (64, 5, 256)])
def test_vgg_small_images(image, pools, features):
    graph = cnn.vgg16(batch=2, image=image, classes=10, width=8)
    assert sum(op.kind == "pool2d" for op in graph.ops) == pools
    assert graph.tensor("flatten").shape == (2, features)
    assert graph.tensor("classifier.0.weight").shape == (512, features)  # hidden = 64 * width


@pytest.mark.parametrize("image", [1, 8, 32])
def test_resnet_small_images(image):
    graph = cnn.resnet152(batch=2, image=image, classes=10, width=8)
    assert graph.tensor("avgpool").shape == (2, 256)


def test_cnn_rejects_bad_sizes():
    with pytest.raises(IRError, match=r"op .features.0.conv. \(conv2d\).*too small for kernel"):
        cnn.alexnet(image=6)
    with pytest.raises(IRError, match="width 0"):
        cnn.resnet50(width=0)
    with pytest.raises(IRError, match="batch 0"):
        cnn.vgg16(batch=0)
