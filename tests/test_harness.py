"""tests/harness.py applied to every public layer, both blocks, the augmentation layers and the model."""

import numpy as np
import pytest

from keras_cait.layers import (
    ClassAttention,
    ClassToken,
    LayerScale,
    PatchEmbedding,
    PositionEmbedding,
    StochasticDepth,
    TalkingHeadsAttention,
)
from keras_cait.models.blocks import ClassAttentionBlock, SelfAttentionBlock
from keras_cait.training import MixupCutmix, RandomResizedCrop
from tests.conftest import TINY_CAIT, TINY_SIZE
from tests.harness import run_layer_test, run_model_test

RNG = np.random.default_rng(0)
TOKENS = RNG.normal(size=(2, 5, 16)).astype("float32")
PATCHES = RNG.normal(size=(2, 4, 16)).astype("float32")
CLASS_TOKEN = RNG.normal(size=(2, 1, 16)).astype("float32")
IMAGES = RNG.uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")

LAYERS = {
    "LayerScale": (LayerScale, dict(init_value=0.5), TOKENS, {}),
    "StochasticDepth": (StochasticDepth, dict(rate=0.25, seed=1), TOKENS, {}),
    "TalkingHeadsAttention": (TalkingHeadsAttention, dict(num_heads=4), TOKENS, {}),
    "ClassAttention": (ClassAttention, dict(num_heads=4), TOKENS, {}),
    "PatchEmbedding": (PatchEmbedding, dict(embed_dim=16, patch_size=16), IMAGES, {}),
    "PositionEmbedding": (PositionEmbedding, dict(grid_size=(2, 2)), PATCHES, {}),
    "ClassToken": (ClassToken, {}, PATCHES, {}),
    "SelfAttentionBlock": (SelfAttentionBlock, dict(num_heads=4, init_values=0.1, drop_path_rate=0.1), PATCHES, {}),
    "ClassAttentionBlock": (
        ClassAttentionBlock, dict(num_heads=4, init_values=0.1, drop_path_rate=0.1), [PATCHES, CLASS_TOKEN], {}
    ),
    # The augmentation layers at inference (a deterministic central crop; plain one-hot labels).
    "RandomResizedCrop": (RandomResizedCrop, dict(height=24, width=20), IMAGES, {"training": False}),
    "MixupCutmix": (
        MixupCutmix, dict(num_classes=10), {"images": IMAGES, "labels": np.array([3, 7])}, {"training": False}
    ),
}


@pytest.mark.large
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer(name, tmp_path):
    layer_class, init_kwargs, data, call_kwargs = LAYERS[name]
    run_layer_test(layer_class, init_kwargs, data, tmp_path, call_kwargs=call_kwargs)


@pytest.mark.large
def test_model(tiny_cait, tmp_path):
    images = RNG.uniform(0, 255, size=(2, TINY_SIZE, TINY_SIZE, 3)).astype("float32")
    outputs = run_model_test(lambda: tiny_cait(drop_path_rate=0.1), images, tmp_path, atol=1e-5)
    assert outputs.shape == (2, 1000) and TINY_CAIT["embed_dim"] == 64
