"""Parity with timm, the PyTorch reference: every row of `VARIANTS`, and every released checkpoint.

Each test builds timm's model with every parameter random (see `TimmReference`),
saves its state_dict as a checkpoint, loads that file through `weights=` and
compares logits (and pre-logit class-token features) on the same images:
max |Δ| ≤ 1e-4 × max |reference| in float32.

Every row of `VARIANTS`, released or not, is compared with timm's own `Cait` built from
the row (`test_every_variant_matches_timm_s_cait_built_from_its_row`, the quick loop);
the released checkpoints, at full depth and their own resolution, with timm's named
models (`test_released_variant_matches_timm`, `large`). Whether a row's numbers are the
paper's and timm's is `tests/models/test_variants.py`'s question.
"""

import gc

import keras
import numpy as np
import pytest

import keras_cait
from keras_cait.models import variants
from keras_cait.layers.position_embedding import resize_position_embedding
from keras_cait.models.variants import VARIANTS
from keras_cait.weights import CHECKPOINTS

# timm's parameter counts of the released models.
PARAMETERS = {
    "cait_xxs24_224": 11_956_264,
    "cait_xxs24_384": 12_029_224,
    "cait_xxs36_224": 17_299_720,
    "cait_xxs36_384": 17_372_680,
    "cait_xs24_384": 26_670_088,
    "cait_s24_224": 46_916_200,
    "cait_s24_384": 47_062_120,
    "cait_s36_384": 68_366_632,
    "cait_m36_384": 271_221_352,
    "cait_m48_448": 356_460_520,
}
BIG = ("cait_m36_384", "cait_m48_448")  # batch 1: a forward at 384/448 costs ~10 s on 2 cores


def constructor(arch):
    """'cait_xxs24_384' -> keras_cait.CaiT_XXS24."""
    return getattr(keras_cait, "CaiT_" + arch.split("_")[1].upper())


def keras_outputs(model, images):
    return keras.ops.convert_to_numpy(model(images, training=False))


def free():
    """Big models must not pile up: call after `del model`."""
    keras.backend.clear_session()
    gc.collect()


# What the row test reduces, for time: the row's 24 to 48 self-attention blocks to 2, and the
# input to 32x32 (2x2 patches of 16). Kept from the row: width, heads, LayerScale init (the gammas
# are then drawn at random, as every parameter), patch 16, MLP ratio 4 and the 2 class-attention
# blocks. Every self-attention block has the same structure and the same keys (blocks.<i>.*), so
# 2 of them show the row's mapping; at full depth M48 alone took 45 s on 2 shared cores. Rows of
# one width (S24, S36, S48) thus meet the same timm model; what differs is the row their
# constructor builds, which the test checks too. Full depth, two-digit block indices and real
# resolutions are the released test's.
ROW_DEPTH = 2
ROW_SIDE = 32


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_matches_timm_s_cait_built_from_its_row(variant, timm_reference, monkeypatch):
    """CaiT_<variant>, as the user calls it, against timm.models.cait.Cait(**row), every parameter
    random: the constructor builds its own row (all of it reaches build_cait) and the checkpoint of
    timm's model of that row loads into it and gives its logits."""
    row = VARIANTS[variant]
    reference = timm_reference.model(
        img_size=ROW_SIDE, patch_size=16, mlp_ratio=4.0, depth_token_only=2, num_classes=1000,
        embed_dim=row["embed_dim"], depth=ROW_DEPTH, num_heads=row["num_heads"], init_values=row["init_values"],
    )
    path = timm_reference.save(reference)
    images = timm_reference.images(2, ROW_SIDE)
    logits, _ = timm_reference.outputs(reference, images)

    built = []
    build_cait = variants.build_cait

    def reduced(**arguments):
        built.append(arguments)
        return build_cait(**{**arguments, "depth": ROW_DEPTH})

    monkeypatch.setattr(variants, "build_cait", reduced)
    model = getattr(keras_cait, f"CaiT_{variant}")(
        weights=path, input_shape=(ROW_SIDE, ROW_SIDE, 3), classifier_activation=None
    )
    assert len(built) == 1, "the constructor no longer builds through variants.build_cait"
    assert {key: built[0][key] for key in row} == row, f"CaiT_{variant} built another row than VARIANTS[{variant!r}]"
    timm_reference.assert_matches(keras_outputs(model, images), logits, f"{variant} logits")
    del model
    free()


def test_every_released_checkpoint_is_tested():
    assert set(PARAMETERS) == set(CHECKPOINTS)


@pytest.mark.large
@pytest.mark.parametrize("arch", list(PARAMETERS))
def test_released_variant_matches_timm(arch, timm_reference):
    side = CHECKPOINTS[arch]["resolution"]
    reference = timm_reference.model(arch)
    assert sum(p.numel() for p in reference.parameters()) == PARAMETERS[arch]
    path = timm_reference.save(reference)
    images = timm_reference.images(1 if arch in BIG else 2, side)
    logits, features = timm_reference.outputs(reference, images)
    del reference
    free()

    model = constructor(arch)(weights=path, input_shape=(side, side, 3), classifier_activation=None)
    assert model.count_params() == PARAMETERS[arch]
    timm_reference.assert_matches(keras_outputs(model, images), logits, f"{arch} logits")
    del model
    free()

    backbone = constructor(arch)(
        include_top=False, pooling="token", weights=path, input_shape=(side, side, 3)
    )
    timm_reference.assert_matches(keras_outputs(backbone, images), features, f"{arch} features")
    del backbone
    free()


@pytest.mark.large
def test_official_pth_checkpoint_matches_timm(timm_reference, tmp_path):
    """The DeiT release format: torch pickle of {"model": {"module.<key>": tensor}}."""
    import torch

    reference = timm_reference.model("cait_xxs24_224")
    path = tmp_path / "XXS24_224.pth"
    torch.save({"model": {"module." + k: v for k, v in reference.state_dict().items()}}, path)
    images = timm_reference.images(2, 224)
    logits, _ = timm_reference.outputs(reference, images)

    model = keras_cait.CaiT_XXS24(weights=path, classifier_activation=None)
    timm_reference.assert_matches(keras_outputs(model, images), logits, "logits from .pth")


@pytest.mark.large
def test_checkpoint_at_224_loaded_at_288_matches_timm_with_resized_pos_embed(timm_reference):
    """DeiT's fine-tuning recipe: bicubic resize of the 14x14 position grid to 18x18."""
    import torch

    source = timm_reference.model("cait_xxs24_224")
    path = timm_reference.save(source)
    state = source.state_dict()
    dim = state["pos_embed"].shape[-1]
    grid = state["pos_embed"].reshape(1, 14, 14, dim).permute(0, 3, 1, 2)
    resized = torch.nn.functional.interpolate(grid, size=(18, 18), mode="bicubic", align_corners=False)
    state["pos_embed"] = resized.permute(0, 2, 3, 1).reshape(1, 18 * 18, dim)
    reference = timm_reference.model("cait_xxs24_224", img_size=288)
    reference.load_state_dict(state)
    images = timm_reference.images(2, 288)
    logits, features = timm_reference.outputs(reference, images)

    model = keras_cait.CaiT_XXS24(weights=path, input_shape=(288, 288, 3), classifier_activation=None)
    timm_reference.assert_matches(keras_outputs(model, images), logits, "logits at 288")
    backbone = keras_cait.CaiT_XXS24(
        include_top=False, pooling="token", weights=path, input_shape=(288, 288, 3)
    )
    timm_reference.assert_matches(keras_outputs(backbone, images), features, "features at 288")


@pytest.mark.parametrize("grid", [(24, 24), (7, 7), (18, 10), (5, 21)])
def test_resize_position_embedding_equals_torch_bicubic(grid):
    import torch

    rng = np.random.default_rng(0)
    embedding = rng.normal(size=(1, 14 * 14, 8)).astype("float32")
    source = torch.from_numpy(embedding).reshape(1, 14, 14, 8).permute(0, 3, 1, 2)
    expected = torch.nn.functional.interpolate(source, size=grid, mode="bicubic", align_corners=False)
    expected = expected.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], 8).numpy()

    resized = resize_position_embedding(embedding, grid)

    assert resized.shape == expected.shape
    np.testing.assert_allclose(resized, expected, atol=1e-5, rtol=0)


def test_resize_position_embedding_refuses_a_non_square_source():
    with pytest.raises(ValueError, match="195 is not a square number"):
        resize_position_embedding(np.zeros((1, 195, 8), "float32"), (14, 14))
