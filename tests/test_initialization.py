"""Initialisation as timm's CaiT: a fresh `CaiT_S24` against a fresh `cait_s24_224`.

timm initialises in `Cait.__init__` and `Cait._init_weights`. For every kind of
parameter (a timm key with the block index removed, e.g. `blocks.attn.proj_l.weight`)
the values of all blocks are pooled and compared with timm's own: constants must be
equal; random ones must have timm's std (5 standard errors), timm's truncation (the
largest |value| and the share beyond 2 std) and pass a two-sample Kolmogorov-Smirnov
test against timm's values.
"""

import re

import keras
import numpy as np
import pytest

import keras_cait
from keras_cait.weights.convert import timm_key_map

# timm, torch and scipy (scikit-learn's) come with the [test] extra: missing is an error, not a skip.
import timm
import torch
from scipy import stats

pytestmark = pytest.mark.large  # timm's and keras_cait's full-size S24, built once (18 s)

BLOCK = r"(blocks|blocks_token_only)"
KINDS = [
    "patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed", "cls_token",
    *(f"blocks.{name}" for name in (
        "norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias",
        "attn.proj_l.weight", "attn.proj_l.bias", "attn.proj_w.weight", "attn.proj_w.bias",
        "attn.proj.weight", "attn.proj.bias", "gamma_1", "norm2.weight", "norm2.bias",
        "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias", "gamma_2",
    )),
    *(f"blocks_token_only.{name}" for name in (
        "norm1.weight", "norm1.bias", "attn.q.weight", "attn.q.bias", "attn.k.weight",
        "attn.k.bias", "attn.v.weight", "attn.v.bias", "attn.proj.weight", "attn.proj.bias",
        "gamma_1", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
        "mlp.fc2.weight", "mlp.fc2.bias", "gamma_2",
    )),
    "norm.weight", "norm.bias", "head.weight", "head.bias",
]
KS_SAMPLE = 200_000


def kind(key):
    return re.sub(rf"^{BLOCK}\.\d+\.", r"\1.", key)


@pytest.fixture(scope="module")
def pooled():
    """{kind: (keras values, timm values)}, each the kind's values of every block."""
    torch.manual_seed(0)
    keras.utils.set_random_seed(0)
    reference = timm.create_model("cait_s24_224", pretrained=False)
    theirs = {key: value.detach().numpy() for key, value in reference.state_dict().items()}
    del reference
    model = keras_cait.CaiT_S24(weights=None)
    pooled = {}
    for key, variable, transform in timm_key_map(model):
        value = transform(theirs[key]) if transform else theirs[key]
        ours_list, theirs_list = pooled.setdefault(kind(key), ([], []))
        ours_list.append(keras.ops.convert_to_numpy(variable).ravel())
        theirs_list.append(value.ravel())
    del model
    keras.backend.clear_session()
    return {k: (np.concatenate(o), np.concatenate(t)) for k, (o, t) in pooled.items()}


@pytest.mark.large
def test_every_kind_of_parameter_is_compared(pooled):
    assert sorted(pooled) == sorted(KINDS)


@pytest.mark.parametrize("name", KINDS)
def test_parameter_kind_is_initialised_as_timm(name, pooled):
    ours, theirs = pooled[name]
    assert ours.shape == theirs.shape
    if np.ptp(theirs) == 0:
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{name}: timm's constant")
        return
    n = ours.size
    # The std of a sample has a standard error of about std / sqrt(2n).
    assert abs(ours.std() / theirs.std() - 1) < 5 / np.sqrt(2 * n), (
        f"{name}: std {ours.std():.4g}, timm {theirs.std():.4g}"
    )
    # Truncation: no larger values than timm's, and as many beyond 2 std (Keras'
    # TruncatedNormal would have none there, timm's trunc_normal_ has 4.6 %).
    assert np.abs(ours).max() <= 1.25 * np.abs(theirs).max(), name
    beyond = 2 * theirs.std()
    share, timm_share = np.mean(np.abs(ours) > beyond), np.mean(np.abs(theirs) > beyond)
    assert abs(share - timm_share) < 5 * np.sqrt(timm_share * (1 - timm_share) / n) + 1e-3, (
        f"{name}: {share:.3%} beyond 2 std, timm {timm_share:.3%}"
    )
    rng = np.random.default_rng(0)
    sample = lambda x: rng.choice(x, KS_SAMPLE, replace=False) if x.size > KS_SAMPLE else x
    assert stats.ks_2samp(sample(ours), sample(theirs)).pvalue > 1e-3, name
