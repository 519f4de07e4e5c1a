"""MixupCutmix: DeiT/CaiT's batch mixing, mixup or cutmix chosen per batch, with soft labels.

The mixing is pure functions of an `ops` namespace (`keras.ops` by default);
the layer draws the random numbers and calls them. `keras_cait.training.stream`
calls the same functions with TensorFlow ops inside tf.data, whatever the Keras
backend. Built on the public `keras.layers.Layer` (Keras does not export the
base of its image augmentation layers), which is why a call inside tf.data
needs the TensorFlow backend; the training stream does not go through `call`.
"""

import math

import keras
import numpy

from keras_cait.errors import ArgumentError, checked_count, checked_number


def cutmix_probability(mixup_alpha, cutmix_alpha, switch_prob):
    """How often a batch gets cutmix rather than mixup."""
    if not cutmix_alpha:
        return 0.0
    return switch_prob if mixup_alpha else 1.0


def transformation_from_draws(
    switch, mixup_lambda, cutmix_lambda, centre, height, width, mixup_alpha, cutmix_alpha, switch_prob,
    ops=keras.ops,
):
    """Turns the random draws of one batch into its transformation.

    Args:
        switch: U(0, 1); cutmix when below `cutmix_probability`.
        mixup_lambda: a Beta(α_m, α_m) draw (any value if mixup is off).
        cutmix_lambda: a Beta(α_c, α_c) draw (any value if cutmix is off).
        centre: two U(0, 1) draws, the box centre's row and column.
        height, width: image size.
        mixup_alpha, cutmix_alpha, switch_prob: the layer's arguments.
        ops: `keras.ops`, or a namespace of the same functions on TensorFlow.

    Returns:
        dict of `use_cutmix` (bool), `box` (`[top, bottom, left, right]`
        pixels, empty for mixup) and `lambda`, the weight of the unreversed
        batch (for cutmix, the fraction of its pixels that remain).
    """
    height, width = ops.cast(height, "float32"), ops.cast(width, "float32")
    use_cutmix = switch < cutmix_probability(mixup_alpha, cutmix_alpha, switch_prob)
    if not mixup_alpha and not cutmix_alpha:
        return {"use_cutmix": use_cutmix, "box": ops.zeros((4,)), "lambda": ops.ones(())}

    cut = ops.sqrt(1.0 - ops.cast(cutmix_lambda, "float32"))
    cut_height, cut_width = ops.floor(height * cut), ops.floor(width * cut)
    row, column = ops.floor(centre[0] * height), ops.floor(centre[1] * width)
    # An odd side puts its extra pixel after the centre, as timm's rand_bbox
    # (cy - cut_h // 2 to cy + (cut_h + 1) // 2).
    box = ops.stack([
        ops.clip(row - ops.floor(cut_height / 2), 0, height),
        ops.clip(row + ops.floor((cut_height + 1) / 2), 0, height),
        ops.clip(column - ops.floor(cut_width / 2), 0, width),
        ops.clip(column + ops.floor((cut_width + 1) / 2), 0, width),
    ])
    pasted = (box[1] - box[0]) * (box[3] - box[2]) / (height * width)
    box = ops.where(use_cutmix, box, ops.zeros((4,)))
    lam = ops.where(use_cutmix, 1.0 - pasted, ops.cast(mixup_lambda, "float32"))
    return {"use_cutmix": use_cutmix, "box": box, "lambda": lam}


def mix_images(images, transformation, ops=keras.ops):
    """`(B, H, W, C)` images mixed with themselves reversed, by the batch's transformation."""
    reversed_images = ops.flip(images, axis=0)
    shape = ops.shape(images)
    rows = ops.arange(shape[1], dtype="float32")[:, None]
    columns = ops.arange(shape[2], dtype="float32")[None, :]
    top, bottom, left, right = (transformation["box"][i] for i in range(4))
    inside = (rows >= top) & (rows < bottom) & (columns >= left) & (columns < right)
    cutmixed = ops.where(inside[None, :, :, None], reversed_images, images)
    lam = ops.cast(transformation["lambda"], images.dtype)
    mixed = lam * images + (1.0 - lam) * reversed_images
    return ops.where(transformation["use_cutmix"], cutmixed, mixed)


def one_hot_labels(labels, num_classes, ops=keras.ops):
    """Class indices `(B,)` or one-hot `(B, K)` -> float32 `(B, K)`."""
    labels = ops.convert_to_tensor(labels)
    if len(labels.shape) == 1:
        labels = ops.one_hot(ops.cast(labels, "int32"), num_classes, dtype="float32")
    return ops.cast(labels, "float32")


def mix_labels(labels, transformation, num_classes, label_smoothing, ops=keras.ops):
    """Smoothed labels mixed as the images were: λ s(y) + (1 - λ) s(ỹ)."""
    labels = one_hot_labels(labels, num_classes, ops)
    labels = labels * (1.0 - label_smoothing) + label_smoothing / num_classes
    lam = transformation["lambda"]
    return lam * labels + (1.0 - lam) * ops.flip(labels, axis=0)


def _static_shape(tensor):
    """The shape as known before the values (None where a traced dimension is not)."""
    shape = tensor.shape if hasattr(tensor, "shape") else numpy.shape(tensor)
    return tuple(None if size is None else int(size) for size in shape)


def _values_at_hand(tensor):
    """`tensor` as a numpy array where its values are at hand (eager, numpy), else None (traced by
    tf.function, tf.data or jax.jit)."""
    if isinstance(tensor, (numpy.ndarray, list, tuple)):
        return numpy.asarray(tensor)
    try:
        return keras.ops.convert_to_numpy(tensor)
    except Exception:  # a symbolic tensor: its values come when the graph runs
        return None


@keras.saving.register_keras_serializable(package="keras_cait")
class MixupCutmix(keras.layers.Layer):
    """Mixes each batch with itself reversed, by mixup or by cutmix, and returns soft labels.

    Per batch, one λ and one choice, as timm's `Mixup(mode="batch")` that DeiT
    trains with. With x̃, ỹ the batch in reverse order:

        cutmix (probability `switch_prob`), λ ~ Beta(α_c, α_c):
            a box of area (1 - λ)·H·W at a uniform random centre (clipped at
            the borders) is pasted from x̃ into x, and λ becomes the exact
            fraction of x's pixels that remain;
        mixup otherwise, λ ~ Beta(α_m, α_m):
            x = λ x + (1 - λ) x̃;
        labels, smoothed with ε = `label_smoothing` over K classes:
            y = λ s(y) + (1 - λ) s(ỹ),    s(y) = (1 - ε) one_hot(y) + ε / K.

    Each label row sums to 1. With both α at 0 nothing is mixed and the labels
    are only smoothed; at inference (`training=False`) images pass unchanged and
    labels become plain one-hot vectors. Keras core's `MixUp` and `CutMix` draw
    λ per sample and do not switch between the two, hence this layer.

    Args:
        num_classes: K, the width of the soft labels.
        mixup_alpha: α_m (DeiT `--mixup 0.8`); 0 disables mixup.
        cutmix_alpha: α_c (DeiT `--cutmix 1.0`); 0 disables cutmix.
        switch_prob: probability of cutmix when both are enabled (DeiT
            `--mixup-switch-prob 0.5`).
        label_smoothing: ε (DeiT `--smoothing 0.1`).
        seed: optional integer seed.
        **kwargs: standard layer arguments.

    Call arguments:
        data: a dict `{"images": (B, H, W, C), "labels": (B,) class indices or
            (B, K) one-hot}`; returns the same dict with mixed images and
            `(B, K)` float soft labels.

    Example:
        >>> mix = MixupCutmix(num_classes=1000)
        >>> dataset = dataset.batch(128).map(
        ...     lambda x, y: tuple(mix({"images": x, "labels": y}).values()))
    """

    def __init__(
        self,
        num_classes,
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        switch_prob=0.5,
        label_smoothing=0.1,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # Each argument refused by its own name: num_classes=10.7 used to be cut to 10 and 0 to make NaN
        # labels (ε / 0), a NaN or inf alpha was taken, and a str failed on `<` with a TypeError.
        checked_count("num_classes", num_classes, 10)
        for name, value, example in (("mixup_alpha", mixup_alpha, 0.8), ("cutmix_alpha", cutmix_alpha, 1.0)):
            checked_number(name, value, lambda alpha: 0 <= alpha < math.inf, "of at least 0 (0 disables it)", example)
        checked_number("switch_prob", switch_prob, lambda p: 0 <= p <= 1, "in [0, 1]", 0.5)
        checked_number("label_smoothing", label_smoothing, lambda e: 0 <= e < 1, "in [0, 1)", 0.1)
        self.num_classes = int(num_classes)
        self.mixup_alpha = float(mixup_alpha)
        self.cutmix_alpha = float(cutmix_alpha)
        self.switch_prob = float(switch_prob)
        self.label_smoothing = float(label_smoothing)
        self.seed = seed
        self.generator = keras.random.SeedGenerator(seed)

    @property
    def cutmix_probability(self):
        """How often a batch gets cutmix rather than mixup."""
        return cutmix_probability(self.mixup_alpha, self.cutmix_alpha, self.switch_prob)

    def __call__(self, *args, **kwargs):
        # Checked before Keras' call, which would rewrap the ArgumentError as a RuntimeError.
        self._check_data(args[0] if args else kwargs.get("data"))
        return super().__call__(*args, **kwargs)

    def call(self, data, training=True):
        transformation = self.get_random_transformation(data, training=training)
        return {
            "images": self.transform_images(data["images"], transformation, training=training),
            "labels": self.transform_labels(data["labels"], transformation, training=training),
        }

    def _check_data(self, data):
        """An `ArgumentError` naming `data` where it cannot be mixed as asked: not a dict of images and
        labels, images that are no batch, labels of another width or count, or (where their values
        are at hand, not inside a traced function) a class index past `num_classes`. Each of these
        was mixed silently into labels that do not sum to 1, or failed deep inside the mixing."""
        wanted = 'a dict {"images": (B, H, W, C), "labels": (B,) class indices or (B, K) one-hot}'
        example = 'e.g. mix({"images": images, "labels": labels})'
        if not isinstance(data, dict):
            what = "images alone: the labels are mixed with them" if hasattr(data, "shape") else \
                f"a {type(data).__name__}"
            raise ArgumentError("data", data, f"MixupCutmix takes {wanted}, not {what}", example, usage=True,
                                shown=f"<{type(data).__name__}>")
        missing = [key for key in ("images", "labels") if key not in data]
        if missing:
            raise ArgumentError("data", data, f"has no {' or '.join(map(repr, missing))}; MixupCutmix takes {wanted}",
                                example, usage=True, shown=f"<dict of {', '.join(map(repr, data))}>")
        images, labels = data["images"], data["labels"]
        image_shape, label_shape = _static_shape(images), _static_shape(labels)
        shown = f"<images {image_shape}, labels {label_shape}>"
        if len(image_shape) != 4:
            raise ArgumentError("data", data, f"its images of shape {image_shape} are no batch", "they must be "
                                "(B, H, W, C): batch them first", usage=True, shown=shown)
        one_hot = len(label_shape) == 2 and label_shape[1] == self.num_classes
        if len(label_shape) != 1 and not one_hot:
            raise ArgumentError("data", data, f"its labels of shape {label_shape} are neither (B,) class indices nor "
                                f"(B, {self.num_classes}) one-hot labels of num_classes={self.num_classes}", usage=True,
                                shown=shown)
        if None not in (image_shape[0], label_shape[0]) and image_shape[0] != label_shape[0]:
            raise ArgumentError("data", data, f"has {label_shape[0]} labels for {image_shape[0]} images",
                                "give one label per image", usage=True, shown=shown)
        indices = None if one_hot else _values_at_hand(labels)
        if indices is not None and indices.size and not (0 <= indices.min() and indices.max() < self.num_classes):
            wrong = int(indices.max()) if indices.max() >= self.num_classes else int(indices.min())
            raise ArgumentError("data", data, f"holds the class index {wrong}, outside num_classes={self.num_classes}",
                                f"class indices are 0 to {self.num_classes - 1}", shown=shown)

    def get_random_transformation(self, data, training=True):
        """Draws the mixing of one batch (see `transformation_from_draws`); None at inference."""
        if not training:
            return None
        images = data["images"] if isinstance(data, dict) else data
        random = keras.random
        switch = random.uniform((), seed=self.generator)
        mixup_lambda = cutmix_lambda = 1.0
        if self.mixup_alpha:
            mixup_lambda = random.beta((), self.mixup_alpha, self.mixup_alpha, seed=self.generator)
        if self.cutmix_alpha:
            cutmix_lambda = random.beta((), self.cutmix_alpha, self.cutmix_alpha, seed=self.generator)
        centre = random.uniform((2,), seed=self.generator)
        shape = keras.ops.shape(images)
        return self.transformation_from_draws(switch, mixup_lambda, cutmix_lambda, centre, shape[1], shape[2])

    def transformation_from_draws(self, switch, mixup_lambda, cutmix_lambda, centre, height, width):
        """`transformation_from_draws` with this layer's alphas and switch probability."""
        return transformation_from_draws(
            switch, mixup_lambda, cutmix_lambda, centre, height, width,
            self.mixup_alpha, self.cutmix_alpha, self.switch_prob,
        )

    def transform_images(self, images, transformation, training=True):
        images = keras.ops.cast(images, self.compute_dtype)
        if not training or transformation is None:
            return images
        return mix_images(images, transformation)

    def transform_labels(self, labels, transformation, training=True):
        if not training or transformation is None:
            return one_hot_labels(labels, self.num_classes)
        return mix_labels(labels, transformation, self.num_classes, self.label_smoothing)

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, dict):  # labels become (batch, num_classes) soft labels
            return {"images": input_shape["images"], "labels": (input_shape["labels"][0], self.num_classes)}
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "mixup_alpha": self.mixup_alpha,
            "cutmix_alpha": self.cutmix_alpha,
            "switch_prob": self.switch_prob,
            "label_smoothing": self.label_smoothing,
            "seed": self.seed,
        }
