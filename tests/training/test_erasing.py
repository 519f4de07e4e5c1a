"""Random erasing against timm's own `RandomErasing(probability=0.25, mode="pixel")`.

Both erase the same number of blank normalised images; the statistics of what they
erase must agree within their sampling error: how often an image is erased, the
box's area, aspect (h / w) and position, and the fill (unclipped N(0, 1)).
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_cait.models.architecture import IMAGENET_MEAN, IMAGENET_STD
from keras_cait.training import augment
from keras_cait.training.erasing import erasing_box

# timm, torch and scipy (scikit-learn's) come with the [test] extra: missing is an error, not a skip.
import timm.data.random_erasing as random_erasing_module
import torch
from scipy import stats

IMAGES = 4000
HEIGHT, WIDTH, CHANNELS = 12, 64, 3  # flat: half of the boxes drawn do not fit, so retries matter
BLANK = 1e6  # no N(0, 1) draw comes near it


def boxes_and_fills(erased):
    """(erased?, h, w, top, left) per image and the fill values, from (N, H, W, C) arrays."""
    records, fills = [], []
    for image in erased:
        changed = np.any(image != BLANK, axis=-1)
        if not changed.any():
            records.append((0, 0, 0, 0, 0))
            continue
        rows, columns = np.nonzero(changed.any(axis=1))[0], np.nonzero(changed.any(axis=0))[0]
        top, left = rows[0], columns[0]
        h, w = rows[-1] - top + 1, columns[-1] - left + 1
        assert changed.sum() == h * w, "the erased pixels are not one box"
        records.append((1, h, w, top, left))
        fills.append(image[top:top + h, left:left + w].ravel())
    return np.array(records), np.concatenate(fills)


@pytest.fixture(scope="module")
def timm_erased():
    import random

    random.seed(0)
    torch.manual_seed(0)
    erasing = random_erasing_module.RandomErasing(probability=0.25, mode="pixel", device="cpu")
    images = torch.full((IMAGES, CHANNELS, HEIGHT, WIDTH), BLANK)
    for image in images:
        erasing(image)
    return boxes_and_fills(images.permute(0, 2, 3, 1).numpy())


@pytest.fixture(scope="module")
def our_erased():
    keys = tf.random.experimental.stateless_split(tf.constant([0, 0], tf.int64), IMAGES)

    def erase(key):
        mask, noise = erasing_box((HEIGHT, WIDTH, CHANNELS), key)
        return tf.where(mask, noise, tf.fill((HEIGHT, WIDTH, CHANNELS), BLANK))

    erased = tf.data.Dataset.from_tensor_slices(keys).map(erase).batch(IMAGES)
    return boxes_and_fills(next(iter(erased)).numpy())


def test_as_many_images_are_erased(our_erased, timm_erased):
    ours, theirs = our_erased[0][:, 0].mean(), timm_erased[0][:, 0].mean()
    assert abs(ours - 0.25) < 4 * np.sqrt(0.25 * 0.75 / IMAGES)
    assert abs(ours - theirs) < 4 * np.sqrt(2 * 0.25 * 0.75 / IMAGES)


@pytest.mark.parametrize(
    "statistic",
    ["area", "log_aspect", "height", "width", "top", "left"],
)
def test_boxes_are_distributed_as_timms(statistic, our_erased, timm_erased):
    def values(records):
        erased = records[records[:, 0] == 1]
        h, w, top, left = erased[:, 1], erased[:, 2], erased[:, 3], erased[:, 4]
        return {
            "area": h * w / (HEIGHT * WIDTH), "log_aspect": np.log(h / w), "height": h,
            "width": w, "top": top + h / 2, "left": left + w / 2,
        }[statistic]

    ours, theirs = values(our_erased[0]), values(timm_erased[0])
    error = np.sqrt(ours.var() / ours.size + theirs.var() / theirs.size)
    assert abs(ours.mean() - theirs.mean()) < 4 * error, statistic
    assert abs(ours.std() / theirs.std() - 1) < 0.1, statistic
    assert stats.ks_2samp(ours, theirs).pvalue > 1e-3, statistic


def test_fill_is_unclipped_standard_normal_like_timms(our_erased, timm_erased):
    ours, theirs = our_erased[1], timm_erased[1]
    for fill in (ours, theirs):
        assert abs(fill.mean()) < 0.01 and abs(fill.std() - 1) < 0.01
        assert fill.min() < -4 and fill.max() > 4
        assert np.mean(fill == 0) < 1e-5
    sample = np.random.default_rng(0)
    assert stats.ks_2samp(sample.choice(ours, 100_000), sample.choice(theirs, 100_000)).pvalue > 1e-3


def test_on_0_255_images_only_the_box_changes_and_the_fill_is_noise_in_normalised_space():
    image = tf.fill((64, 64, 3), 100.0)
    key = tf.constant([3, 4], tf.int64)
    erased = augment.random_erasing(probability=1.0)(image, key).numpy()
    mask, noise = erasing_box((64, 64, 3), key, probability=1.0)
    mask = np.broadcast_to(mask.numpy(), erased.shape)
    assert mask.any() and not mask.all()
    np.testing.assert_array_equal(erased[~mask], 100.0)
    normalised = (erased - 255 * np.array(IMAGENET_MEAN)) / (255 * np.array(IMAGENET_STD))
    np.testing.assert_allclose(normalised[mask], noise.numpy()[mask], atol=1e-5)


def test_probability_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="probability=1.5"):
        augment.random_erasing(1.5)
