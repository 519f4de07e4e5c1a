"""The CaiT architecture: the functional model, `CaiTModel`, and its builder, `build_cait`.

Touvron, Cord, Sablayrolles, Synnaeve, Jégou: "Going deeper with Image
Transformers", ICCV 2021 (arXiv 2103.17239).

    images ─ patch embedding + position embedding
           ─ depth × SelfAttentionBlock     (patches attend to patches, talking heads)
           ─ 2 × ClassAttentionBlock        (the class token attends to [class, patches])
           ─ LayerNorm ─ linear head on the class token

The pieces live beside it: `blocks` (the two blocks), `precision` (which layers stay float32 under
a mixed policy), `inputs` (the input shape and the image check), `class_names` (a classifier's names).
"""

import inspect
import math
import numbers

import keras
import numpy as np
from keras import ops

from keras_cait.deprecation import moved_names
from keras_cait.errors import ArgumentError, Named, checked_bool, checked_count, checked_number, quietly_caused
from keras_cait.layers import ClassToken, PatchEmbedding, PositionEmbedding
from keras_cait.layers.initializers import linear_kernel
from keras_cait.models import blocks
from keras_cait.models import class_names as naming
from keras_cait.models import inputs as image_inputs
from keras_cait.models import precision
from keras_cait.preprocessing import IMAGENET_MEAN, IMAGENET_STD

POOLING_MODES = (None, "token", "avg")
HEAD_NAME = "predictions"
PREDICT_BATCH_SIZE = 32  # Keras' default batch_size of predict


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
      the classes of any functional classifier. `keras.models.clone_model`
      makes its clone from the inputs and outputs alone, so the clone's are
      None: `clone.class_names = model.class_names`.

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
        self._class_names = naming.checked_class_names(names, self)

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
        settled = image_inputs.check_images(images, self.inputs[0].shape, self.name)
        if not settled and image_inputs.is_open_graph_tensor(images):
            from keras_cait.models.runtime_checks import checked_images

            height, width, channels = tuple(self.inputs[0].shape)[1:]
            images = checked_images(images, (height, width, channels), (
                f"{self.name} takes images of shape (batch, {height}, {width}, {channels})"
            ))
            args, kwargs = ((images, *args[1:]), kwargs) if args else (args, {**kwargs, "inputs": images})
        return super().__call__(*args, **kwargs)

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        image_inputs.check_images(x, self.inputs[0].shape, self.name)
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


def checked_activation(activation, argument="classifier_activation"):
    """The Keras activation function `activation` names (None: linear), or an `ArgumentError` naming
    `argument` where Keras knows no such activation."""
    try:
        return keras.activations.get(activation)
    except (ValueError, TypeError) as error:
        raise quietly_caused(ArgumentError(argument, activation, "not a Keras activation",
                                           "e.g. 'softmax', or None for logits", usage=True), error) from None


def classifier_head(classes, activation, dtype, argument="classifier_activation"):
    """The linear head of a CaiT classifier, `predictions`: `classes` outputs, weights from a
    truncated N(0, 0.02²) and zero bias, as timm and DeiT initialise theirs (a new head of a
    fine-tuning too). `dtype`: its policy, float32 under a mixed one (`layer_dtype`). `build_cait`,
    `with_new_head` and keras-hub's `CaiTImageClassifier` make their heads here; an `activation`
    Keras does not know is an `ArgumentError` naming `argument`."""
    checked_activation(activation, argument)
    return keras.layers.Dense(classes, activation=activation, kernel_initializer=linear_kernel(), name=HEAD_NAME,
                              dtype=dtype)


def checked_classes(classes, argument="classes"):
    """`classes`, the number of classes of a head, as an int (a numpy integer too), after checking that
    it is a positive integer (not a bool, a float or a str); else an `ArgumentError` naming `argument`.
    `build_cait`, `with_new_head`, `load_classifier` and keras-hub's `CaiTImageClassifier`
    (`num_classes`) take a head's classes through it."""
    return checked_count(argument, classes, 10, note=", the number of classes")


def checked_drop_path_rate(drop_path_rate, argument="drop_path_rate"):
    """`drop_path_rate`, the stochastic-depth rate, as a float after checking that it is a number in
    [0, 1) (not a bool or a str); else an `ArgumentError` naming `argument`."""
    if isinstance(drop_path_rate, bool) or not isinstance(drop_path_rate, numbers.Real):
        raise ArgumentError(argument, drop_path_rate,
                            f"must be a number in [0, 1), not {type(drop_path_rate).__name__}", "e.g. 0.1", usage=True)
    if not 0 <= drop_path_rate < 1:
        raise ArgumentError(argument, drop_path_rate, "must be a number in [0, 1)", "e.g. 0.1", usage=True)
    return float(drop_path_rate)


# build_cait's numbers of the architecture, which `checked_architecture` checks.
ARCHITECTURE_NUMBERS = ("embed_dim", "depth", "num_heads", "patch_size", "mlp_ratio", "init_values",
                        "class_attention_depth")


def checked_architecture(*, embed_dim, depth, num_heads, init_values, patch_size=16, mlp_ratio=4.0,
                         class_attention_depth=2):
    """build_cait's architecture numbers as a dict of Python ints and floats, or an `ArgumentError`
    naming the first that cannot build a CaiT (a str from a JSON config, a fraction of a block, 0 heads)."""
    return dict(zip(ARCHITECTURE_NUMBERS, _checked_sizes(embed_dim, depth, num_heads, patch_size, mlp_ratio, init_values,
                                          class_attention_depth)))


def _checked_sizes(embed_dim, depth, num_heads, patch_size, mlp_ratio, init_values, class_attention_depth):
    """`checked_architecture`'s numbers in this order (build_cait's local names)."""
    embed_dim = checked_count("embed_dim", embed_dim, 192, note=", the width of the tokens")
    depth = checked_count("depth", depth, 24, minimum=0, note=", the self-attention blocks")
    num_heads = checked_count("num_heads", num_heads, 4)
    if embed_dim % num_heads:
        divisors = [heads for heads in range(1, min(embed_dim, 16) + 1) if embed_dim % heads == 0]
        raise ArgumentError("num_heads", num_heads, ["must divide ", Named("embed_dim", embed_dim),
                            " into heads of equal width"], f"e.g. one of {', '.join(map(str, divisors))}", usage=True)
    patch_size = checked_count("patch_size", patch_size, 16)
    class_attention_depth = checked_count("class_attention_depth", class_attention_depth, 2, minimum=0)
    mlp_ratio = float(checked_number("mlp_ratio", mlp_ratio, lambda ratio: 0 < ratio < math.inf, "above 0", 4.0))
    if int(embed_dim * mlp_ratio) < 1:  # was Keras' "invalid value for `units`", naming no argument of ours
        raise ArgumentError("mlp_ratio", mlp_ratio, ["gives an MLP of no units: int(", Named("embed_dim", embed_dim),
                            f" × {mlp_ratio}) = 0"], f"give at least {1 / embed_dim:.3g}, e.g. mlp_ratio=4.0",
                            usage=True)
    init_values = float(checked_number("init_values", init_values, lambda value: 0 <= value < math.inf,
                                       "of at least 0, LayerScale's first gamma", 1e-5))
    return embed_dim, depth, num_heads, patch_size, mlp_ratio, init_values, class_attention_depth


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
    `input_shape`: `(height, width, channels)` in `keras.config.image_data_format()`; None reads it
    from `input_tensor`, or is 224×224 RGB without one.

    Raises an `ArgumentError` (a ValueError) naming `classes` (with `include_top`), `drop_path_rate`
    or `input_shape` where one is of the wrong type or out of range, before any layer is built.
    """
    if pooling not in POOLING_MODES:
        raise ArgumentError("pooling", pooling, "unknown pooling", f"give one of {', '.join(map(repr, POOLING_MODES))}",
                            usage=True)
    dtype = precision.checked_dtype(dtype)
    include_top = checked_bool("include_top", include_top, "True (with the head) or False (its features)")
    include_preprocessing = checked_bool("include_preprocessing", include_preprocessing,
                                         "True (it normalises 0..255 RGB itself) or False")
    if include_top:
        classes = checked_classes(classes)
    embed_dim, depth, num_heads, patch_size, mlp_ratio, init_values, class_attention_depth = _checked_sizes(
        embed_dim, depth, num_heads, patch_size, mlp_ratio, init_values, class_attention_depth)
    drop_path_rate = checked_drop_path_rate(drop_path_rate)
    if not isinstance(name, str) or not name.strip() or "/" in name:  # was Keras' error, or a model named ''
        raise ArgumentError("name", name, "must be a model's name: a str, not empty, without '/'",
                            ["e.g. ", Named("name", "cait")], usage=True)
    if input_tensor is not None and not keras.utils.is_keras_tensor(input_tensor):
        # Keras' own error printed the whole array
        kind = type(input_tensor).__name__
        raise ArgumentError("input_tensor", input_tensor, f"must be a Keras tensor, the output of keras.Input or a "
                            f"layer, not {kind}", ["e.g. ", Named("input_tensor", shown="keras.Input((224, 224, 3))"),
                            ", or give ", Named("input_shape"), " instead"], usage=True, shown=f"<{kind}>")
    input_shape = image_inputs.checked_input_shape(input_shape)
    if input_shape is None and input_tensor is None:
        input_shape = image_inputs.image_shape(224, 224)

    # === Inputs ===
    if input_tensor is not None:
        input_shape = tuple(input_tensor.shape[1:])
        inputs = input_tensor
    else:
        inputs = keras.Input(shape=input_shape, name="images")
    channels_first = keras.config.image_data_format() == "channels_first"
    input_shape = image_inputs.channels_last_shape(input_shape)
    image_inputs.check_input_shape(input_shape, patch_size)
    grid_size = (input_shape[0] // patch_size, input_shape[1] // patch_size)

    # === Patches and positions ===
    def layer(name):  # every layer's name and dtype policy, float32 as FLOAT32_UNDER_MIXED says
        return dict(name=name, dtype=precision.layer_dtype(name, dtype))

    x = inputs
    if channels_first:
        x = keras.layers.Permute((2, 3, 1), **layer(image_inputs.CHANNELS_LAST_LAYER))(x)
    if include_preprocessing and input_shape[2] != 3:
        raise ArgumentError("input_shape", image_inputs.image_shape(*input_shape),
                            f"has {input_shape[2]} channels, and include_preprocessing normalises RGB images with "
                            "the ImageNet mean and std", ["for other images give ", Named("include_preprocessing", False),
                            " and normalise the inputs yourself"], usage=True)
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
        patches = blocks.SelfAttentionBlock(
            **block_args, drop_path_rate=drop_path_rate, **layer(f"self_attention_block_{i}")
        )(patches)

    # === Class-attention stage ===
    class_token = ClassToken(**layer("class_token"))(patches)
    for i in range(class_attention_depth):
        class_token = blocks.ClassAttentionBlock(**block_args, **layer(f"class_attention_block_{i}"))(
            [patches, class_token]
        )

    # === Head ===
    # Under mixed precision the final norm, the logits and the outputs stay float32.
    final_norm = keras.layers.LayerNormalization(epsilon=blocks.LAYER_NORM_EPSILON, **layer("final_norm"))
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
        outputs = classifier_head(classes, classifier_activation, precision.layer_dtype(HEAD_NAME, dtype))(features)
    else:
        outputs = features

    # === Functional Model ===
    if input_tensor is not None:
        sources = keras.utils.get_source_inputs(input_tensor)
        inputs = sources[0] if len(sources) == 1 else sources
    if isinstance(inputs, list):  # several sources (an input_tensor built from them)
        return keras.Model(inputs, outputs, name=name)
    return CaiTModel(inputs, outputs, name=name)


__getattr__ = moved_names(__name__)  # the blocks, dtype policies, image checks and class names, moved


# The arguments build_cait takes, by name, and those without a default (read once: a wrapper put around
# build_cait later keeps them).
BUILD_CAIT_ARGUMENTS = tuple(inspect.signature(build_cait).parameters)
BUILD_CAIT_REQUIRED = tuple(name for name, parameter in inspect.signature(build_cait).parameters.items()
                            if parameter.default is inspect.Parameter.empty)
