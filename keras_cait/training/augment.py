"""The training augmentation of DeiT/CaiT as a configuration of Keras layers.

Order, as timm's `create_transform(is_training=True)` that DeiT trains with:
RandomResizedCrop (bicubic) → horizontal flip → RandAugment → random erasing
per image, then mixup/cutmix with label smoothing per batch. `data.training_stream`
runs it in tf.data.
"""

import dataclasses
import math

from keras_cait.errors import checked_bool, checked_count, checked_number
from keras_cait.preprocessing import IMAGENET_MEAN, IMAGENET_STD
from keras_cait.training.mixup_cutmix import MixupCutmix
from keras_cait.training.rand_augment import RandAugment
from keras_cait.training import random_resized_crop
from keras_cait.training.random_resized_crop import RandomResizedCrop
from keras_cait.training.knobs import DEIT

# The rotation range of timm's RandAugment at magnitude 10 (rotate: ±30°).
_TIMM_MAX_ROTATION_DEGREES = 30.0


def rand_augment(magnitude=9, num_ops=2, seed=None):
    """Keras core's `RandAugment` at the strength of timm's magnitude `magnitude` (of 10).

    The layer is `keras_cait.training.rand_augment.RandAugment`: Keras' own, computing
    only the ops it applies (the same images, about 11 times less work).

    DeiT trains with `--aa rand-m9-mstd0.5-inc1`: 2 ops per image at magnitude 9.
    Keras' RandAugment applies one `factor` to all its ops on scales of its own
    (rotation by factor × 360°, posterization to int(8 × factor) bits, ...), so
    no factor reproduces timm. We take `factor = magnitude / 10 × 30 / 360`,
    which gives timm's rotation range (±27° at magnitude 9) rather than Keras'
    literal "magnitude / 10" (±324°, which would turn objects upside down); its
    shear, translation and colour ops are then milder than timm's.

    The layer computes in float32 whatever the global dtype policy: the input
    pipeline hands the model float32 images 0..255 under every policy, and the
    model casts them at its input. (Keras' augmentation layers otherwise follow
    a mixed policy and return float16/bfloat16 images.)
    """
    # A str '9' from a config used to fail on `<=`; a numpy float in range inside Keras (its `factor`
    # must be a Python float); a float or negative num_ops inside tf.data, far from the call.
    magnitude = float(checked_number("magnitude", magnitude, lambda m: 0 <= m <= 10, "in [0, 10] as timm's", 9))
    num_ops = checked_count("num_ops", num_ops, 2, minimum=0)
    factor = magnitude / 10 * _TIMM_MAX_ROTATION_DEGREES / 360
    return RandAugment(value_range=(0, 255), num_ops=num_ops, factor=factor, seed=seed, dtype="float32")


def random_erasing(probability=0.25):
    """timm's `RandomErasing(probability, mode="pixel")` on 0..255 images (DeiT `--reprob 0.25`).

    timm erases after the ImageNet normalisation, filling the box with N(0, 1)
    noise; our stream normalises inside the model, so the noise is mapped to
    0..255 (`noise × std + mean`, unclipped) and the other pixels stay exactly
    as they are. See `erasing.erasing_box` for the sampling and why
    Keras core's `RandomErasing` cannot do it.

    Returns:
        a function `(image (H, W, 3) float 0..255, stateless key (2,)) -> image`.
    """
    # A str '0.25' used to fail on `<=`, and True to be taken as an erasure of every image.
    probability = float(checked_number("probability", probability, lambda p: 0 <= p <= 1, "in [0, 1]", 0.25))
    # tf.data code: imported here so that `keras_cait.training` loads without TensorFlow
    # (the JAX backend's training, e.g. on a GPU machine without TensorFlow).
    import tensorflow as tf

    from keras_cait.training.erasing import erasing_mask, erasing_noise

    mean = [255.0 * m for m in IMAGENET_MEAN]
    std = [255.0 * s for s in IMAGENET_STD]

    def erase(image, key):
        shape = tf.shape(image)
        mask = erasing_mask(shape, key, probability)
        # The noise is drawn only for an image that gets a box (a quarter of them at DeiT's 0.25).
        return tf.cond(
            tf.reduce_any(mask),
            lambda: tf.where(mask, erasing_noise(shape, key) * std + mean, image),
            lambda: image,
        )

    return erase


# Augmentation's numbers: (field, lowest, highest or None, highest allowed, DeiT's value as the example).
_NUMBER_RANGES = (
    ("rand_augment_magnitude", 0, 10, True, DEIT.randaugment),
    ("random_erasing", 0, 1, True, DEIT.reprob),
    ("mixup_alpha", 0, None, True, DEIT.mixup),
    ("cutmix_alpha", 0, None, True, DEIT.cutmix),
    ("switch_prob", 0, 1, True, DEIT.mixup_switch_prob),
    ("label_smoothing", 0, 1, False, DEIT.smoothing),
)


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """DeiT/CaiT's training augmentation; every default is DeiT's (`knobs.DEIT`, which says where
    each comes from). `Recipe.augmentation(image_size, num_classes)` makes one from a recipe.

    Attributes:
        image_size: side of the square training crops (DeiT `--input-size 224`).
        num_classes: width of the soft labels.
        scale, ratio: RandomResizedCrop's area and aspect ranges (timm's defaults).
        horizontal_flip: flip half of the images (timm `hflip=0.5`).
        rand_augment_magnitude: RandAugment strength of 10; 0 disables it
            (`--aa rand-m9-mstd0.5-inc1`).
        random_erasing: probability of erasing a box (`--reprob 0.25`).
        mixup_alpha, cutmix_alpha, switch_prob: `--mixup 0.8 --cutmix 1.0
            --mixup-switch-prob 0.5`, one λ per batch (`--mixup-mode batch`).
        label_smoothing: `--smoothing 0.1`.
        repeats: repeated augmentation, the number of differently augmented
            copies of each image per epoch (`--repeated-aug`: 3); 1 disables it.
    """

    image_size: int
    num_classes: int
    scale: tuple = (0.08, 1.0)
    ratio: tuple = (3 / 4, 4 / 3)
    horizontal_flip: bool = True
    rand_augment_magnitude: float = DEIT.randaugment
    random_erasing: float = DEIT.reprob
    mixup_alpha: float = DEIT.mixup
    cutmix_alpha: float = DEIT.cutmix
    switch_prob: float = DEIT.mixup_switch_prob
    label_smoothing: float = DEIT.smoothing
    repeats: int = DEIT.repeated_aug

    def __post_init__(self):
        # Checked here, by the names given: the stream's layers would name their own arguments later
        # (`magnitude`, `probability`) or fail on a type inside tf.data.
        for name, example, note in (("image_size", 224, ""), ("num_classes", 10, ""),
                                    ("repeats", DEIT.repeated_aug, " (1 disables repetition)")):
            checked_count(name, getattr(self, name), example, note=note)
        # A str 'no' from a config is truthy: it used to flip half of the images it meant to leave alone.
        object.__setattr__(self, "horizontal_flip", checked_bool(
            "horizontal_flip", self.horizontal_flip, "True (flip half of the images) or False"))
        # Checked here rather than by `crop()` when the stream starts: scale=0.5 failed there on a
        # subscript, and (1.0, 0.08) as a ValueError far from the Augmentation that held it.
        random_resized_crop.checked_scale(self.scale)
        random_resized_crop.checked_ratio(self.ratio)
        for name, low, high, closed, example in _NUMBER_RANGES:
            within = f"in [{low}, {high}{']' if closed else ')'}" if high is not None else f"of at least {low}"
            checked_number(name, getattr(self, name), lambda value: low <= value and (
                math.isfinite(value) if high is None else value < high or closed and value == high), within, example)

    # The layers compute in float32 under any global policy, as `rand_augment` does.
    def crop(self):
        return RandomResizedCrop(
            self.image_size, self.image_size, scale=self.scale, ratio=self.ratio, dtype="float32"
        )

    def mix(self):
        return MixupCutmix(
            self.num_classes,
            mixup_alpha=self.mixup_alpha,
            cutmix_alpha=self.cutmix_alpha,
            switch_prob=self.switch_prob,
            label_smoothing=self.label_smoothing,
            dtype="float32",
        )
