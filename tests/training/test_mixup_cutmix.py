"""MixupCutmix: one λ per batch, mixup or cutmix, labels that sum to 1 and weigh what was mixed."""

import numpy as np
import pytest
import tensorflow as tf

from keras_cait.training import MixupCutmix

CLASSES, SMOOTHING = 10, 0.1


def batch(size=4, seed=0):
    rng = np.random.default_rng(seed)
    # Distinct values everywhere, so that every output pixel tells where it came from.
    images = rng.permutation(size * 16 * 16 * 3).reshape(size, 16, 16, 3).astype("float32")
    return images, np.arange(size)


def analyse(images, labels, out_images, out_labels):
    """Returns (mode, λ from the pixels, λ from the labels) per sample."""
    reversed_images = images[::-1]
    from_self = out_images == images
    from_other = out_images == reversed_images
    label_of = np.take_along_axis(out_labels, labels[:, None], axis=1)[:, 0]
    label_lambda = (label_of - SMOOTHING / CLASSES) / (1 - SMOOTHING)
    if np.all(from_self | from_other):
        pixel_lambda = from_self.reshape(len(images), -1).mean(axis=1)
        return "cutmix", pixel_lambda, label_lambda
    pixel_lambda = (out_images - reversed_images) / (images - reversed_images)
    return "mixup", pixel_lambda.reshape(len(images), -1), label_lambda


def test_labels_sum_to_one_and_weigh_what_was_mixed():
    layer = MixupCutmix(CLASSES, label_smoothing=SMOOTHING, seed=0)
    images, labels = batch()
    modes = []
    for _ in range(60):
        out = layer({"images": images, "labels": labels})
        out_images, out_labels = out["images"].numpy(), out["labels"].numpy()
        np.testing.assert_allclose(out_labels.sum(axis=1), 1.0, rtol=1e-6)
        mode, pixel_lambda, label_lambda = analyse(images, labels, out_images, out_labels)
        modes.append(mode)
        if mode == "cutmix":
            # The cut box is the same for the whole batch, and λ is the kept area.
            assert np.all(pixel_lambda == pixel_lambda[0])
            np.testing.assert_allclose(label_lambda, pixel_lambda, atol=1e-6)
        else:
            # One λ for every pixel of every sample.
            np.testing.assert_allclose(pixel_lambda, pixel_lambda[0, 0], atol=1e-3)
            np.testing.assert_allclose(label_lambda, np.median(pixel_lambda), atol=1e-4)
    assert {"mixup", "cutmix"} == set(modes)


@pytest.mark.large
def test_cutmix_is_chosen_with_the_switch_probability():
    layer = MixupCutmix(CLASSES, switch_prob=0.5, seed=1)
    images, labels = batch(size=2)
    transformations = [layer.get_random_transformation({"images": images}) for _ in range(400)]
    cutmix = np.mean([bool(t["use_cutmix"]) for t in transformations])
    assert 0.4 < cutmix < 0.6  # 0.5 ± 4 standard deviations
    mixup_lambdas = [float(t["lambda"]) for t in transformations if not bool(t["use_cutmix"])]
    assert 0.4 < np.mean(mixup_lambdas) < 0.6  # Beta(0.8, 0.8) is symmetric about 1/2


@pytest.mark.parametrize("mixup, cutmix, mode", [(0.8, 0.0, "mixup"), (0.0, 1.0, "cutmix")])
def test_one_method_alone(mixup, cutmix, mode):
    layer = MixupCutmix(CLASSES, mixup_alpha=mixup, cutmix_alpha=cutmix, seed=2)
    images, labels = batch()
    for _ in range(10):
        out = layer({"images": images, "labels": labels})
        found, _, _ = analyse(images, labels, out["images"].numpy(), out["labels"].numpy())
        assert found == mode or np.array_equal(out["images"].numpy(), images)


def test_without_mixing_labels_are_only_smoothed_and_at_inference_plain():
    images, labels = batch()
    layer = MixupCutmix(CLASSES, mixup_alpha=0.0, cutmix_alpha=0.0, label_smoothing=SMOOTHING)
    out = layer({"images": images, "labels": labels})
    np.testing.assert_array_equal(out["images"].numpy(), images)
    smoothed = np.full((4, CLASSES), SMOOTHING / CLASSES)
    smoothed[np.arange(4), labels] += 1 - SMOOTHING
    np.testing.assert_allclose(out["labels"].numpy(), smoothed, rtol=1e-6)

    out = MixupCutmix(CLASSES)({"images": images, "labels": labels}, training=False)
    np.testing.assert_array_equal(out["images"].numpy(), images)
    np.testing.assert_array_equal(out["labels"].numpy(), np.eye(CLASSES)[labels])


def test_runs_in_tf_data_on_batches():
    images, labels = batch()
    layer = MixupCutmix(CLASSES, seed=3)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(4).map(
        lambda x, y: layer({"images": x, "labels": y})
    )
    (element,) = list(dataset)
    assert element["labels"].shape == (4, CLASSES)
    np.testing.assert_allclose(element["labels"].numpy().sum(axis=1), 1.0, rtol=1e-6)


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="mixup_alpha=-1"):
        MixupCutmix(CLASSES, mixup_alpha=-1)
    with pytest.raises(ValueError, match="label_smoothing=1.5"):
        MixupCutmix(CLASSES, label_smoothing=1.5)


_WANTED = 'MixupCutmix takes a dict {"images": (B, H, W, C), "labels": (B,) class indices or (B, K) one-hot}'


@pytest.mark.parametrize("data, line", [
    # Before: a class index past num_classes, one-hot labels of another width, (B, 1) indices and fewer
    # labels than images were all mixed silently into labels that do not sum to 1; the rest failed inside
    # the mixing (Pack, SelectV2, a KeyError), rewrapped by Keras as a RuntimeError.
    (lambda x, y: (x, y), f'data=<tuple>: {_WANTED}, not a tuple; e.g. mix({{"images": images, "labels": labels}})'),
    (lambda x, y: x, f"data=<ndarray>: {_WANTED}, not images alone: the labels are mixed with them; "
                     'e.g. mix({"images": images, "labels": labels})'),
    (lambda x, y: {"images": x}, f"data=<dict of 'images'>: has no 'labels'; {_WANTED}; "
                                 'e.g. mix({"images": images, "labels": labels})'),
    (lambda x, y: {"images": x[0], "labels": y}, "data=<images (16, 16, 3), labels (4,)>: its images of shape "
                                                 "(16, 16, 3) are no batch; they must be (B, H, W, C): batch them first"),
    (lambda x, y: {"images": x, "labels": np.eye(CLASSES + 1)[y]},
     f"data=<images (4, 16, 16, 3), labels (4, {CLASSES + 1})>: its labels of shape (4, {CLASSES + 1}) are neither "
     f"(B,) class indices nor (B, {CLASSES}) one-hot labels of num_classes={CLASSES}"),
    (lambda x, y: {"images": x, "labels": y[:, None]},
     f"data=<images (4, 16, 16, 3), labels (4, 1)>: its labels of shape (4, 1) are neither (B,) class indices nor "
     f"(B, {CLASSES}) one-hot labels of num_classes={CLASSES}"),
    (lambda x, y: {"images": x, "labels": y[:3]},
     "data=<images (4, 16, 16, 3), labels (3,)>: has 3 labels for 4 images; give one label per image"),
    (lambda x, y: {"images": x, "labels": tf.constant([0, 1, 2, CLASSES])},
     f"data=<images (4, 16, 16, 3), labels (4,)>: holds the class index {CLASSES}, outside num_classes={CLASSES}; "
     f"class indices are 0 to {CLASSES - 1}"),
    (lambda x, y: {"images": x, "labels": [0, -1, 2, 3]},
     f"data=<images (4, 16, 16, 3), labels (4,)>: holds the class index -1, outside num_classes={CLASSES}; "
     f"class indices are 0 to {CLASSES - 1}"),
])
def test_data_that_cannot_be_mixed_as_asked_is_refused_naming_what_is_wrong(data, line):
    from keras_cait.errors import ArgumentError

    images, labels = batch()
    for training in (True, False):
        with pytest.raises(ArgumentError) as caught:
            MixupCutmix(CLASSES, seed=0)(data(images, labels), training=training)
        assert str(caught.value) == line


@pytest.mark.parametrize(
    "switch, lam, cy, cx",
    [(0.2, 0.7, 5, 9), (0.2, 0.3, 0, 19), (0.2, 0.05, 11, 0), (0.2, 0.999, 6, 10),
     (0.8, 0.7, 0, 0), (0.8, 0.1, 0, 0)],
    ids=["cutmix", "cutmix-corner", "cutmix-large-box", "cutmix-empty-box", "mixup", "mixup-low"],
)
def test_same_images_and_targets_as_timms_mixup_for_the_same_draws(monkeypatch, switch, lam, cy, cx):
    """timm's `Mixup` (DeiT's settings, mode="batch") with its numpy draws scripted, and
    ours given the same draws: the switch, λ and the box centre (cy, cx)."""
    import torch  # the [test] extra: missing is an error, not a skip
    from timm.data.mixup import Mixup

    height, width, size = 12, 20, 4
    rng = np.random.default_rng(0)
    images = rng.normal(size=(size, height, width, 3)).astype("float32")
    labels = np.array([3, 1, 4, 1])

    draws = iter([0.0, switch])  # mix_prob, then cutmix-or-mixup
    centre = iter([cy, cx])
    monkeypatch.setattr(np.random, "rand", lambda: next(draws))
    monkeypatch.setattr(np.random, "beta", lambda a, b: lam)
    monkeypatch.setattr(np.random, "randint", lambda low, high, size=None: next(centre))
    reference = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, mode="batch",
                      label_smoothing=SMOOTHING, num_classes=CLASSES)
    timm_images, timm_targets = reference(
        torch.from_numpy(images.transpose(0, 3, 1, 2).copy()), torch.from_numpy(labels)
    )
    monkeypatch.undo()

    mix = MixupCutmix(CLASSES, mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5,
                      label_smoothing=SMOOTHING)
    transformation = mix.transformation_from_draws(
        switch, lam, lam, tf.constant([(cy + 0.5) / height, (cx + 0.5) / width]), height, width
    )
    ours = mix.transform_images(tf.constant(images), transformation).numpy()
    targets = mix.transform_labels(tf.constant(labels), transformation).numpy()

    np.testing.assert_allclose(ours, timm_images.numpy().transpose(0, 2, 3, 1), atol=1e-6)
    np.testing.assert_allclose(targets, timm_targets.numpy(), atol=1e-6)
