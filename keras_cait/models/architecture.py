"""The CaiT architecture: its two kinds of block and the functional builder.

Touvron, Cord, Sablayrolles, Synnaeve, Jégou: "Going deeper with Image
Transformers", ICCV 2021 (arXiv 2103.17239).

    images ─ patch embedding + position embedding
           ─ depth × SelfAttentionBlock     (patches attend to patches, talking heads)
           ─ 2 × ClassAttentionBlock        (the class token attends to [class, patches])
           ─ LayerNorm ─ linear head on the class token
"""

import numbers

import keras
import numpy as np
from keras import ops

from keras_cait.errors import ArgumentError, Named
from keras_cait.layers import (
    ClassAttention,
    ClassToken,
    LayerScale,
    PatchEmbedding,
    PositionEmbedding,
    StochasticDepth,
    TalkingHeadsAttention,
)
from keras_cait.layers.initializers import linear_kernel
from keras_cait.preprocessing import IMAGENET_MEAN, IMAGENET_STD, imagenet_classes

LAYER_NORM_EPSILON = 1e-6
POOLING_MODES = (None, "token", "avg")
HEAD_NAME = "predictions"


def is_mixed(policy):
    """Whether `policy` computes in half precision on float32 variables ("mixed_float16",
    "mixed_bfloat16"; a `DTypePolicyMap` by its default policy). Every decision that depends on
    mixed precision asks this (`float32_if_mixed`, hence `layer_dtype` and `has_dtype_policy`)."""
    policy = keras.dtype_policies.get(policy)
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        policy = policy.default_policy
    return policy.compute_dtype != policy.variable_dtype


def float32_if_mixed(policy):
    """The dtype policy of the residual stream, LayerNorm and head: "float32" under a mixed
    policy, else the name of `policy`.

    Under "mixed_float16" / "mixed_bfloat16" the matmuls run in half precision
    while the normalisation statistics, their gamma/beta and the logits stay in
    float32, as torch.autocast keeps them in the reference's AMP training.
    A `DTypePolicyMap` (per-layer policies, as keras-hub rebuilds a quantized
    model) is returned as it is, or with a float32 default where its default is mixed.
    """
    policy = keras.dtype_policies.get(policy)
    map_policy = isinstance(policy, keras.dtype_policies.DTypePolicyMap)
    if not is_mixed(policy):
        return policy if map_policy else policy.name
    if map_policy:
        return keras.dtype_policies.DTypePolicyMap("float32", dict(policy.items()))
    return "float32"


# The layers of `build_cait` (and the head of `with_new_head`) that compute in float32 under a
# mixed policy: the residual stream's parameters, the final norm, the pooling and the head. Inside
# each block, `_ResidualBlock.build` keeps its norms and LayerScale float32 likewise.
FLOAT32_UNDER_MIXED = ("position_embedding", "class_token", "final_norm", "token_pool", "avg_pool", "predictions")


def layer_dtype(name, policy):
    """The dtype policy of the layer `name` of a CaiT under `policy`: what `build_cait` gives it,
    and what `keras_cait.training.with_dtype_policy` rebuilds it with."""
    return float32_if_mixed(policy) if name in FLOAT32_UNDER_MIXED else policy


def has_dtype_policy(model, policy):
    """Whether every layer of the CaiT `model` has the dtype policy it would have if built under
    `policy` (`layer_dtype`), e.g. `has_dtype_policy(model, "float32")`."""
    return all(
        layer.dtype_policy.name == keras.dtype_policies.get(layer_dtype(layer.name, policy)).name
        for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)
    )


def float32_gelu(hidden):
    """The exact (erf) GELU, computed in float32 and rounded once to the dtype of `hidden`, as
    PyTorch's half-precision GELU does. In bfloat16 TensorFlow's CPU kernels round each of its
    steps and took 5 % more of a block's training step."""
    return ops.cast(ops.gelu(ops.cast(hidden, "float32"), approximate=False), hidden.dtype)


_rematerialized_gelu = keras.remat(float32_gelu)


class _ResidualBlock(keras.layers.Layer):
    """What both CaiT blocks share: x + SD(λ_1 · attention) then x + SD(λ_2 · MLP).

    Under a mixed policy the residual stream x, the LayerScale multiply and the
    residual adds stay float32 while the attention and MLP matmuls run in half
    precision, as in timm under torch.autocast (its gamma is a float32 parameter,
    so gamma × branch and x + ... are float32). A half-precision stream would
    round away the 1e-5-scaled updates of the blocks at their initialisation.
    """

    attention_class = None

    def __init__(
        self,
        num_heads,
        mlp_ratio=4.0,
        init_values=1e-5,
        drop_path_rate=0.0,
        qkv_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_ratio = float(mlp_ratio)
        self.init_values = float(init_values)
        self.drop_path_rate = float(drop_path_rate)
        self.qkv_bias = bool(qkv_bias)

    @property
    def input_dtype(self):
        # The stream enters in the variables' dtype (float32 under a mixed policy)
        # rather than being cast to the half compute dtype.
        return self.dtype_policy.variable_dtype

    def build(self, input_shape):
        channels = input_shape[-1]
        policy = self.dtype_policy
        stream_policy = float32_if_mixed(policy)

        def norm(name):
            return keras.layers.LayerNormalization(
                epsilon=LAYER_NORM_EPSILON, name=name, dtype=float32_if_mixed(policy)
            )

        self.attention_norm = norm("attention_norm")
        self.attention = self.attention_class(
            self.num_heads, qkv_bias=self.qkv_bias, name="attention", dtype=policy
        )
        self.attention_layer_scale = LayerScale(
            self.init_values, name="attention_layer_scale", dtype=stream_policy
        )
        self.mlp_norm = norm("mlp_norm")
        # GELU is applied in _mlp_residual, in float32.
        self.mlp_dense_1 = keras.layers.Dense(
            int(channels * self.mlp_ratio),
            kernel_initializer=linear_kernel(),
            name="mlp_dense_1",
            dtype=policy,
        )
        self.mlp_dense_2 = keras.layers.Dense(
            channels, kernel_initializer=linear_kernel(), name="mlp_dense_2", dtype=policy
        )
        self.mlp_layer_scale = LayerScale(
            self.init_values, name="mlp_layer_scale", dtype=stream_policy
        )
        self.stochastic_depth = StochasticDepth(
            self.drop_path_rate, name="stochastic_depth", dtype=stream_policy
        )

        token_shape = (None, None, channels)
        for layer in (self.attention_norm, self.attention, self.mlp_norm, self.mlp_dense_1):
            layer.build(token_shape)
        self.attention_layer_scale.build(token_shape)
        self.mlp_dense_2.build((None, None, int(channels * self.mlp_ratio)))
        self.mlp_layer_scale.build(token_shape)
        # Built here too: compute_output_spec skips call(), and model.quantize() refuses unbuilt layers.
        self.stochastic_depth.build(token_shape)

    def _mlp_residual(self, x, training):
        hidden = self.mlp_dense_1(self.mlp_norm(x))
        if hidden.dtype != "float32" and keras.backend.backend() == "jax":
            # Recomputed in the backward pass from its half-precision input: otherwise JAX keeps
            # the float32 copy of the MLP's widest tensor for it, and XLA:GPU writes and reads
            # it again (S24 at batch 128: 9 % of the training step's memory traffic,
            # docs/benchmarks.md). Not on TensorFlow, whose CPU step is not bound by it.
            hidden = _rematerialized_gelu(hidden)
        else:
            hidden = float32_gelu(hidden)
        branch = self.mlp_dense_2(hidden)
        return x + self.stochastic_depth(self.mlp_layer_scale(branch), training=training)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_ratio": self.mlp_ratio,
            "init_values": self.init_values,
            "drop_path_rate": self.drop_path_rate,
            "qkv_bias": self.qkv_bias,
        }


@keras.saving.register_keras_serializable(package="keras_cait")
class SelfAttentionBlock(_ResidualBlock):
    """A CaiT self-attention block over the patch tokens (reference: `blocks.i`).

        x = x + SD(λ_1 · TalkingHeadsAttention(LN(x)))
        x = x + SD(λ_2 · MLP(LN(x)))
    """

    attention_class = TalkingHeadsAttention

    def call(self, patches, training=None, return_attention_scores=False):
        attended = self.attention(
            self.attention_norm(patches), return_attention_scores=return_attention_scores
        )
        if return_attention_scores:
            attended, scores = attended
        x = patches + self.stochastic_depth(
            self.attention_layer_scale(attended), training=training
        )
        x = self._mlp_residual(x, training)
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, patches, training=None, return_attention_scores=False):
        output = keras.KerasTensor(patches.shape, dtype=self.input_dtype)
        if not return_attention_scores:
            return output
        batch, tokens = patches.shape[0], patches.shape[1]
        scores_shape = (batch, self.num_heads, tokens, tokens)
        return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)


@keras.saving.register_keras_serializable(package="keras_cait")
class ClassAttentionBlock(_ResidualBlock):
    """A CaiT class-attention block (reference: `blocks_token_only.i`).

        z      = [x_class, x_patches]
        x_class = x_class + SD(λ_1 · ClassAttention(LN(z)))
        x_class = x_class + SD(λ_2 · MLP(LN(x_class)))

    Called as `block([patches, class_token])`; returns the new class token only:
    the patches are left as they are.
    """

    attention_class = ClassAttention

    def build(self, input_shape):
        super().build(input_shape[0])

    def call(self, inputs, training=None, return_attention_scores=False):
        patches, class_token = inputs
        tokens = ops.concatenate([class_token, patches], axis=1)
        attended = self.attention(
            self.attention_norm(tokens), return_attention_scores=return_attention_scores
        )
        if return_attention_scores:
            attended, scores = attended
        x = class_token + self.stochastic_depth(
            self.attention_layer_scale(attended), training=training
        )
        x = self._mlp_residual(x, training)
        return (x, scores) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape[1]

    def compute_output_spec(self, inputs, training=None, return_attention_scores=False):
        patches, class_token = inputs
        output = keras.KerasTensor(class_token.shape, dtype=self.input_dtype)
        if not return_attention_scores:
            return output
        tokens = None if patches.shape[1] is None else 1 + patches.shape[1]
        scores_shape = (patches.shape[0], self.num_heads, 1, tokens)
        return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)


PREDICT_BATCH_SIZE = 32  # Keras' default batch_size of predict


def channels_last_shape(input_shape):
    """`(height, width, channels)` of an input shape given in `keras.config.image_data_format()`.

    Under "channels_first" the constructors take `(channels, height, width)`, as
    keras.applications do, and the model transposes its input to channels last
    once, first thing (the patch convolution then runs channels last on every
    backend, TensorFlow's CPU kernels included, and the weights are the same).
    """
    input_shape = tuple(input_shape)
    if keras.config.image_data_format() != "channels_first" or len(input_shape) != 3:
        return input_shape
    channels, height, width = input_shape
    if width in (1, 3, 4) and channels not in (1, 3, 4):
        raise ValueError(
            f"input_shape {input_shape}: keras.config.image_data_format() is 'channels_first', so "
            f"input shapes are (channels, height, width), e.g. ({width}, {channels}, {height}); or "
            "keras.config.set_image_data_format('channels_last') for (height, width, channels)."
        )
    return (height, width, channels)


def image_shape(height, width, channels=3):
    """An input shape of `height`×`width` images in `keras.config.image_data_format()`."""
    if keras.config.image_data_format() == "channels_first":
        return (channels, height, width)
    return (height, width, channels)


def check_input_shape(input_shape, patch_size):
    """Raises a ValueError unless `input_shape` is (H, W, C) with H, W multiples of the patch."""
    if len(input_shape) != 3:
        raise ValueError(
            f"input_shape {tuple(input_shape)}: expected (height, width, channels), e.g. (224, 224, 3)."
        )
    height, width, channels = input_shape
    if channels is None or channels < 1:
        raise ValueError(
            f"input_shape {tuple(input_shape)}: the number of channels must be a positive "
            f"integer, e.g. ({height}, {width}, 3) for RGB."
        )
    if height is None or width is None:
        raise ValueError(
            f"input_shape {tuple(input_shape)}: height and width must be known, because the "
            "position embedding is sized to the patch grid, e.g. (224, 224, 3)."
        )
    if height % patch_size or width % patch_size or height <= 0 or width <= 0:
        suggestion = (
            max(patch_size, round(height / patch_size) * patch_size),
            max(patch_size, round(width / patch_size) * patch_size),
            input_shape[2],
        )
        raise ValueError(
            f"input_shape {tuple(input_shape)}: sides must be positive multiples of the patch "
            f"size {patch_size}, e.g. {suggestion}."
        )


def checked_image_size(image_size, patch_size=16, argument="image_size"):
    """`image_size` (the side of square images) as an int, after checking that it is a positive
    integer multiple of `patch_size`; else an `ArgumentError` naming `argument` and a size that is."""
    if isinstance(image_size, bool) or not isinstance(image_size, numbers.Integral) or image_size <= 0:
        kind = "" if isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool) else \
            f", an int, not {type(image_size).__name__}"
        raise ArgumentError(argument, image_size, f"must be a positive integer multiple of the patch size {patch_size}"
                            f"{kind}", ["e.g. ", Named(argument, 224 if 224 % patch_size == 0 else patch_size * 14)],
                            usage=True)
    if image_size % patch_size:
        nearest = max(1, int(image_size / patch_size + 0.5)) * patch_size  # halves up: 200 -> 208
        raise ArgumentError(argument, image_size, f"must be a multiple of the patch size {patch_size}",
                            ["e.g. ", Named(argument, nearest)], usage=True)
    return int(image_size)


def check_images(images, input_shape, model_name):
    """Raises a ValueError unless `images` fit `input_shape` `(batch, H, W, C)`; TypeError for text.

    Reads the static shape only (numpy arrays, tensors, traced or symbolic
    tensors), so it adds nothing to a compiled graph. Returns whether the
    static shape settles it: False when the rank, height, width or channels are
    unknown until run time (`CaiTModel.__call__` then checks in the graph).
    """
    dtype = str(getattr(images, "dtype", ""))
    if dtype == "object" or "str" in dtype or dtype.startswith(("<U", "|S", "<S")):
        raise TypeError(
            f"images of dtype {dtype}: {model_name} takes pixels as numbers (uint8 or float, "
            "0..255), not file names or encoded bytes; read files with "
            "keras_cait.preprocessing.load_image(path, image_size) first."
        )
    shape = getattr(images, "shape", None)
    try:
        shape = None if shape is None else tuple(None if d is None else int(d) for d in shape)
    except (TypeError, ValueError):  # unknown rank: nothing known to check
        return False
    if shape is None:
        return True
    expected = tuple(input_shape)[1:]
    height, width, channels = expected
    takes = f"{model_name} takes images of shape (batch, {height}, {width}, {channels})"
    if len(shape) != 4:
        fix = (
            "for one image add the batch axis: images[None]" if len(shape) == 3
            else f"reshape them to one batch axis: images.reshape((-1, {height}, {width}, {channels}))"
        )
        raise ValueError(f"images of shape {shape}: {takes}; {fix}.")
    if shape[0] == 0:
        raise ValueError(
            f"images of shape {shape}: a batch of 0 images; {takes}, at least one of them. "
            "Skip empty batches before calling the model."
        )
    if shape[3] not in (None, channels):
        fix = {
            1: "convert grayscale to RGB, e.g. np.repeat(images, 3, axis=-1)",
            4: "drop the alpha channel: images[..., :3]",
        }.get(shape[3] if channels == 3 else None, (
            f"give {channels}-channel images, or build the model with input_shape=({height}, "
            f"{width}, {shape[3]}) and include_preprocessing=False"
        ))
        raise ValueError(f"images of shape {shape}: {takes}, {channels} channels; {fix}.")
    if shape[1] not in (None, height) or shape[2] not in (None, width):
        raise ValueError(
            f"images of shape {shape}: {takes}; resize and centre-crop them to {height}×{width} "
            f"(e.g. keras.layers.Resizing({height}, {width}, crop_to_aspect_ratio=True)), or "
            f"build the model with input_shape=({shape[1]}, {shape[2]}, {channels})."
        )
    return None not in shape[1:]


def _open_graph_tensor(images):
    """Whether `images` is a TensorFlow graph tensor (the one place a shape is left open)."""
    return (
        keras.backend.backend() == "tensorflow"
        and not isinstance(images, keras.KerasTensor)
        and ops.is_tensor(images)
        and not hasattr(images, "numpy")  # eager tensors have a known shape
    )


@keras.saving.register_keras_serializable(package="keras_cait")
class CaiTModel(keras.Model):
    """The functional model that `build_cait` returns.

    Two things differ from a plain functional `keras.Model`:

    - It refuses images of another shape. Keras' own input check lets a
      1-channel image broadcast against the RGB normalisation, a single image
      (rank 3) end in an unknown-shape error, and `predict` of 0 images fail
      inside Keras. This check names the shape it got, the one the model takes
      and the fix, for `model(images)`, `predict` and the model called as a
      layer (`check_images`: static shapes, no graph ops; where a TensorFlow
      graph leaves height, width or channels unknown, an assert in the graph,
      `keras_cait.models.runtime_checks`).
    - `predict` skips Keras' data pipeline for one small batch.
      `keras.Model.predict` builds a data adapter, a dataset and an iterator on
      every call, which at batch 1 costs more than the forward pass of a small
      CaiT on a CPU. When the call asks for one batch of data already in memory
      (an array or tensor of at most `batch_size` samples, no `steps`, no
      `callbacks`, one replica) this `predict` runs that batch with
      `predict_on_batch`, i.e. the same compiled predict function, and shows
      the same progress bar for `verbose`; anything else is Keras' own `predict`.

    - It carries the names of its classes (`class_names`), saved in its
      config, so a `.keras` file written after fitting on a folder gives them
      back from `keras.models.load_model`, and the exporters, `keras-cait
      predict` and `evaluate` use them. None (the default) where nobody named
      them; ImageNet models leave them None and `class_names_of` or
      `decode_predictions` name their 1000 classes. `with_class_names` names
      the classes of any functional classifier.

    Example:
        model = keras_cait.CaiT_XXS24()
        model.predict(image[None])  # (1, 1000), without the per-call pipeline
    """

    _class_names = None

    @property
    def class_names(self):
        """The class of each output index as a tuple of str, or None."""
        return self._class_names

    @class_names.setter
    def class_names(self, names):
        self._class_names = checked_class_names(names, self)

    def get_config(self):
        config = super().get_config()
        if self._class_names is not None:
            config["class_names"] = list(self._class_names)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        class_names = config.pop("class_names", None)
        model = super().from_config(config, custom_objects=custom_objects)
        model.class_names = class_names
        return model

    def __call__(self, *args, **kwargs):
        images = args[0] if args else kwargs.get("inputs")
        if not check_images(images, self.inputs[0].shape, self.name) and _open_graph_tensor(images):
            from keras_cait.models.runtime_checks import checked_images

            height, width, channels = tuple(self.inputs[0].shape)[1:]
            images = checked_images(images, (height, width, channels), (
                f"{self.name} takes images of shape (batch, {height}, {width}, {channels})"
            ))
            args, kwargs = ((images, *args[1:]), kwargs) if args else (args, {**kwargs, "inputs": images})
        return super().__call__(*args, **kwargs)

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        check_images(x, self.inputs[0].shape, self.name)
        if not self._is_one_batch(x, batch_size, steps, callbacks):
            return super().predict(x, batch_size=batch_size, verbose=verbose, steps=steps, callbacks=callbacks)
        progress = keras.callbacks.CallbackList(
            None, add_progbar=verbose != 0, verbose=verbose, epochs=1, steps=1, model=self
        )
        progress.on_predict_begin()
        progress.on_predict_batch_begin(0)
        outputs = self.predict_on_batch(x)
        progress.on_predict_batch_end(0, {"outputs": outputs})
        progress.on_predict_end()
        return outputs

    def _is_one_batch(self, x, batch_size, steps, callbacks):
        if steps is not None or callbacks is not None:
            return False
        if not (isinstance(x, np.ndarray) or ops.is_tensor(x)) or len(x.shape) == 0:
            return False
        if not 0 < x.shape[0] <= (batch_size or PREDICT_BATCH_SIZE):
            return False
        # Several replicas split a batch: left to Keras' distributed predict.
        strategy = getattr(self, "distribute_strategy", None)
        replicas = getattr(strategy, "num_replicas_in_sync", 1)
        return replicas == 1 and keras.distribution.distribution() is None


# === Class names ===


def class_count(model):
    """The number of classes a classifier scores (its output is `(batch, classes)`); a ValueError
    for any other model."""
    shape = tuple(model.outputs[0].shape)
    if len(shape) != 2:
        raise ValueError(f"{model.name} outputs {shape}, not class scores (batch, classes); give a "
                         "classifier: a model with its head (include_top=True).")
    return shape[-1]


def checked_class_names(names, model):
    """`names` as a tuple of str, after checking there is one per class of `model`; None stays None."""
    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise TypeError(f"class_names={names!r}: give a list of str, one name per class.")
    names = tuple(names)
    classes = class_count(model)
    if len(names) != classes:
        raise ValueError(f"class_names has {len(names)} names but {model.name} has {classes} "
                         "classes; give one name per class, in the order of the outputs.")
    if len(set(names)) != len(names):
        repeated = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"class_names repeats {repeated}: give each class its own name.")
    return names


def class_names_of(model, wordnet_ids=False):
    """The names of a classifier's classes in index order, or None where they are unknown.

    A model's own `class_names` (a `CaiTModel` fitted on a folder keeps them in
    its `.keras` file) come first; a model of 1000 classes without them is taken
    to be an ImageNet model and gets ImageNet's names ("tabby", or with
    `wordnet_ids` "tabby (n02123159)").
    """
    names = getattr(model, "class_names", None)
    if names is not None:
        return list(names)
    if class_count(model) == len(imagenet_classes()):
        return [f"{name} ({wnid})" if wordnet_ids else name for wnid, name in imagenet_classes()]
    return None


def with_class_names(model, class_names):
    """`model` naming its classes `class_names` (one str per class, in index order), kept in its
    config and in the `.keras` files it is saved to.

    A `CaiTModel` is named in place and returned; another functional classifier
    (e.g. a `.keras` file of a plain `keras.Model`) becomes a `CaiTModel` over
    the same layers, nothing copied. `class_names=None` leaves the names unset.

    Example:
        model = with_class_names(model, ["daisy", "roses"])
    """
    if class_names is None and not isinstance(model, CaiTModel):
        return model
    if not isinstance(model, CaiTModel):
        model = CaiTModel(model.inputs, model.outputs, name=model.name)
    model.class_names = class_names
    return model


def classifier_head(classes, activation, dtype):
    """The linear head of a CaiT classifier, `predictions`: `classes` outputs, weights from a
    truncated N(0, 0.02²) and zero bias, as timm and DeiT initialise theirs (a new head of a
    fine-tuning too). `dtype`: its policy, float32 under a mixed one (`layer_dtype`). `build_cait`,
    `with_new_head` and keras-hub's `CaiTImageClassifier` make their heads here."""
    return keras.layers.Dense(classes, activation=activation, kernel_initializer=linear_kernel(), name=HEAD_NAME,
                              dtype=dtype)


def build_cait(
    *,
    embed_dim,
    depth,
    num_heads,
    init_values,
    patch_size=16,
    mlp_ratio=4.0,
    class_attention_depth=2,
    include_top=True,
    input_tensor=None,
    input_shape=(224, 224, 3),
    pooling=None,
    classes=1000,
    classifier_activation="softmax",
    include_preprocessing=True,
    drop_path_rate=0.0,
    name="cait",
    dtype=None,
):
    """Builds a CaiT as a functional `CaiTModel` (a `keras.Model`) with freshly initialised weights.

    With `include_top=True` the output is the class scores from the class token
    (or from the mean of the patch tokens with `pooling="avg"`). With
    `include_top=False` the output is the normalised token sequence
    `(batch, 1 + patches, embed_dim)` (class token first) for `pooling=None`,
    the class token for `pooling="token"`, the patch mean for `pooling="avg"`.
    `dtype`: the layers' dtype policy (a name, a `DTypePolicy` or a
    `DTypePolicyMap`); None takes the global one (`keras.config.dtype_policy()`).
    """
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling={pooling!r}: must be one of {POOLING_MODES}.")
    if not 0.0 <= drop_path_rate < 1.0:
        raise ValueError(f"drop_path_rate={drop_path_rate!r}: must be in [0, 1), e.g. 0.1.")

    # === Inputs ===
    if input_tensor is not None:
        if not keras.utils.is_keras_tensor(input_tensor):
            input_tensor = keras.Input(tensor=input_tensor, shape=tuple(input_shape))
        input_shape = tuple(input_tensor.shape[1:])
        inputs = input_tensor
    else:
        inputs = keras.Input(shape=tuple(input_shape), name="images")
    channels_first = keras.config.image_data_format() == "channels_first"
    input_shape = channels_last_shape(input_shape)
    check_input_shape(input_shape, patch_size)
    grid_size = (input_shape[0] // patch_size, input_shape[1] // patch_size)

    # === Patches and positions ===
    def layer(name):  # every layer's name and dtype policy, float32 as FLOAT32_UNDER_MIXED says
        return dict(name=name, dtype=layer_dtype(name, dtype))

    x = inputs
    if channels_first:
        x = keras.layers.Permute((2, 3, 1), **layer("channels_last"))(x)
    if include_preprocessing and input_shape[2] != 3:
        raise ValueError(
            f"input_shape {tuple(input_shape)}: include_preprocessing normalises RGB images "
            f"with the ImageNet mean and std; for {input_shape[2]} channels use "
            "include_preprocessing=False and normalise the inputs yourself."
        )
    if include_preprocessing:
        x = keras.layers.Normalization(
            mean=[255.0 * m for m in IMAGENET_MEAN],
            variance=[(255.0 * s) ** 2 for s in IMAGENET_STD],
            **layer("preprocessing"),
        )(x)
    x = PatchEmbedding(embed_dim, patch_size, **layer("patch_embedding"))(x)
    # Under mixed precision the residual stream is float32 from here on (the
    # position embedding and class token are float32 parameters in timm's AMP).
    patches = PositionEmbedding(grid_size, **layer("position_embedding"))(x)

    # === Self-attention stage ===
    block_args = dict(num_heads=num_heads, mlp_ratio=mlp_ratio, init_values=init_values)
    for i in range(depth):
        patches = SelfAttentionBlock(
            **block_args, drop_path_rate=drop_path_rate, **layer(f"self_attention_block_{i}")
        )(patches)

    # === Class-attention stage ===
    class_token = ClassToken(**layer("class_token"))(patches)
    for i in range(class_attention_depth):
        class_token = ClassAttentionBlock(**block_args, **layer(f"class_attention_block_{i}"))(
            [patches, class_token]
        )

    # === Head ===
    # Under mixed precision the final norm, the logits and the outputs stay float32.
    final_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, **layer("final_norm"))
    if pooling == "token" or (include_top and pooling is None):
        # LayerNorm is per token, so normalising the class token alone is exact.
        pool = keras.layers.Flatten(data_format="channels_last", **layer("token_pool"))
        features = pool(final_norm(class_token))
    else:
        tokens = keras.layers.Concatenate(axis=1, **layer("tokens"))([class_token, patches])
        features = final_norm(tokens)
        if pooling == "avg":
            # Pooled from the whole sequence, so that the class-attention blocks stay in
            # the graph (and in the weights) as in the reference, whose "avg" mode
            # computes them too.
            pool = keras.layers.GlobalAveragePooling1D(data_format="channels_last", **layer("avg_pool"))
            features = pool(features[:, 1:])

    if include_top:
        outputs = classifier_head(classes, classifier_activation, layer_dtype(HEAD_NAME, dtype))(features)
    else:
        outputs = features

    # === Functional Model ===
    if input_tensor is not None:
        sources = keras.utils.get_source_inputs(input_tensor)
        inputs = sources[0] if len(sources) == 1 else sources
    if isinstance(inputs, list):  # several sources (an input_tensor built from them)
        return keras.Model(inputs, outputs, name=name)
    return CaiTModel(inputs, outputs, name=name)
