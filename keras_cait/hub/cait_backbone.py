"""`CaiTBackbone`: the CaiT of `keras_cait.models.build_cait` as a keras-hub Backbone."""

import difflib
import inspect

import keras
import keras_hub

from keras_cait.errors import ArgumentError
from keras_cait.hub import presets
from keras_cait.models.architecture import build_cait, checked_architecture
from keras_cait.models.inputs import channels_last_shape, check_input_shape, checked_input_shape

# What Keras' functional Model takes besides a class's own arguments (keras-hub's Task: `compile`).
KERAS_OPTIONS = ("name", "trainable")


def check_options(cls, options, keras_options=KERAS_OPTIONS):
    """An `ArgumentError` naming the first of `options` (the `**kwargs` of `cls.__init__`) that is neither
    an argument of `cls` nor one of `keras_options`: Keras' functional Model drops any other without a
    word, so `depht=12` (or `image_shape` given to the classifier) would build the default silently."""
    arguments = [name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "kwargs")]
    for name, value in options.items():
        if name not in keras_options:
            close = difflib.get_close_matches(name, arguments + list(keras_options), n=1)
            raise ArgumentError(name, value, f"not an argument of {cls.__name__}",
                                (f"did you mean {close[0]}? " if close else "") +
                                f"it takes {', '.join(arguments + list(keras_options))}", usage=True)


@keras.saving.register_keras_serializable(package="keras_cait")
class CaiTBackbone(keras_hub.models.Backbone):
    """CaiT without its head: images -> the normalised token sequence.

    Patch embedding, `depth` self-attention blocks (talking heads, LayerScale),
    `class_attention_depth` class-attention blocks and the final LayerNorm, as
    `keras_cait.models.build_cait` builds them (the same layer names, so the same
    timm key map). Inputs are images already normalised with the ImageNet mean
    and std (`CaiTImageConverter` does it); the output is
    `(batch, 1 + patches, embed_dim)`, the class token first.

    Args:
        image_shape: `(height, width, 3)`, sides multiples of `patch_size`.
        embed_dim, depth, num_heads, init_values: as in `keras_cait.models.VARIANTS`.
        patch_size: side of the square patches (16 for every CaiT).
        mlp_ratio: MLP width / `embed_dim`.
        class_attention_depth: number of class-attention blocks (2).
        drop_path_rate: stochastic-depth rate, the same for every block.
        dtype: dtype policy of the layers: a name ("mixed_bfloat16"), a
            `DTypePolicy`, or a `DTypePolicyMap` (as keras-hub rebuilds a quantized
            backbone); default: the global policy. Under a mixed policy the
            residual stream, the LayerNorms and LayerScale stay float32, as in
            timm under torch.autocast, so the output is float32.

    Example:
        backbone = CaiTBackbone.from_preset("cait_xxs24_224")   # ImageNet weights
        tokens = backbone(np.zeros((1, 224, 224, 3)))          # (1, 197, 192)
    """

    def __init__(
        self,
        image_shape=(224, 224, 3),
        embed_dim=384,
        depth=24,
        num_heads=8,
        init_values=1e-5,
        patch_size=16,
        mlp_ratio=4.0,
        class_attention_depth=2,
        drop_path_rate=0.0,
        dtype=None,
        **kwargs,
    ):
        check_options(CaiTBackbone, kwargs)
        # The numbers first: the image's check divides by patch_size (patch_size=0: ZeroDivisionError).
        checked_architecture(embed_dim=embed_dim, depth=depth, num_heads=num_heads, init_values=init_values,
                             patch_size=patch_size, mlp_ratio=mlp_ratio, class_attention_depth=class_attention_depth)
        image_shape = checked_input_shape(image_shape, "image_shape")
        check_input_shape(channels_last_shape(image_shape), patch_size, "image_shape")
        # === Functional Model ===
        cait = build_cait(
            embed_dim=embed_dim, depth=depth, num_heads=num_heads, init_values=init_values,
            patch_size=patch_size, mlp_ratio=mlp_ratio,
            class_attention_depth=class_attention_depth, include_top=False,
            input_shape=tuple(image_shape), include_preprocessing=False,
            drop_path_rate=drop_path_rate, dtype=dtype,
        )
        super().__init__(inputs=cait.input, outputs=cait.output, dtype=dtype, **kwargs)

        # === Config ===
        self.image_shape = tuple(image_shape)
        self.embed_dim = embed_dim
        self.depth = depth
        self.num_heads = num_heads
        self.init_values = init_values
        self.patch_size = patch_size
        self.mlp_ratio = mlp_ratio
        self.class_attention_depth = class_attention_depth
        self.drop_path_rate = drop_path_rate

    def get_config(self):
        config = super().get_config()
        config.update(
            image_shape=self.image_shape, embed_dim=self.embed_dim, depth=self.depth,
            num_heads=self.num_heads, init_values=self.init_values, patch_size=self.patch_size,
            mlp_ratio=self.mlp_ratio, class_attention_depth=self.class_attention_depth,
            drop_path_rate=self.drop_path_rate,
        )
        return config

    def save_to_preset(self, preset_dir, max_shard_size=10):
        super().save_to_preset(preset_dir, max_shard_size=max_shard_size)
        presets.save_float_dtype(preset_dir)  # a mixed policy would not load back (keras-hub's loader)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """A released checkpoint by its timm name (`"cait_s24_224"`), or any keras-hub preset.

        `weights="/path/to/model.safetensors"` (or a .pth, .pt or .weights.h5 file) reads the released
        preset's weights from that file instead of the network (`presets.weights_argument`).
        """
        weights = presets.weights_argument(preset, load_weights, kwargs)
        if not presets.is_released(preset):
            return super().from_preset(preset, load_weights=load_weights, **kwargs)
        backbone = cls(**{**presets.backbone_config(preset), **kwargs})
        if weights is not None:
            presets.load_weights(backbone, preset, weights)
        return backbone
