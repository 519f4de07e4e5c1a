"""`CaiTImageClassifier`: CaiT as a keras-hub ImageClassifier (from_preset, fit, save_to_preset)."""

import keras
import keras_hub
import numpy

from keras_cait.errors import ArgumentError, checked_number
from keras_cait.hub import presets
from keras_cait.hub.cait_backbone import KERAS_OPTIONS, CaiTBackbone, check_options
from keras_cait.hub.cait_image_classifier_preprocessor import CaiTImageClassifierPreprocessor
from keras_cait.hub.cait_image_converter import CaiTImageConverter, check_images
from keras_cait.models.architecture import checked_classes, classifier_head
from keras_cait.models.precision import checked_dtype, float32_if_mixed

POOLING_MODES = ("token", "avg")


@keras.saving.register_keras_serializable(package="keras_cait")
class CaiTImageClassifier(keras_hub.models.ImageClassifier):
    """A `CaiTBackbone`, its class token (or patch mean) and a linear head.

    With its preprocessor it takes RGB images of any size, 0..255, and runs the
    reference evaluation transform on them (`CaiTImageConverter`).

    Args:
        backbone: a `CaiTBackbone`.
        num_classes: size of the head.
        preprocessor: a `CaiTImageClassifierPreprocessor`, or None for inputs
            already resized and normalised.
        pooling: "token" (the class token, as the checkpoints were trained) or
            "avg" (mean of the patch tokens).
        activation: of the head; None (default) returns logits.
        dropout: before the head.
        head_dtype: dtype policy of the head; default: the backbone's, but
            float32 under a mixed policy, as the float32 stream it reads.

    Example:
        classifier = CaiTImageClassifier.from_preset("cait_s24_224")
        classifier.predict(np.random.randint(0, 256, (1, 480, 640, 3)))  # (1, 1000) logits
        tuned = CaiTImageClassifier.from_preset("cait_xxs24_224", num_classes=5)
        tuned.fit(keras.utils.image_dataset_from_directory("photos/", image_size=(256, 256)))
        tuned.save_to_preset("cait_photos")
    """

    backbone_cls = CaiTBackbone
    preprocessor_cls = CaiTImageClassifierPreprocessor

    def __init__(
        self,
        backbone,
        num_classes,
        preprocessor=None,
        pooling="token",
        activation=None,
        dropout=0.0,
        head_dtype=None,
        **kwargs,
    ):
        if pooling not in POOLING_MODES:
            raise ArgumentError("pooling", pooling, "unknown pooling",
                                f"give one of {', '.join(map(repr, POOLING_MODES))}", usage=True)
        if preprocessor is not None and not isinstance(preprocessor, keras.layers.Layer):
            raise ArgumentError("preprocessor", preprocessor, f"a {type(preprocessor).__name__}, not a Keras layer",
                                "e.g. CaiTImageClassifierPreprocessor.from_preset('cait_xxs24_224'), or None for "
                                "images already resized and normalised", usage=True)
        if not isinstance(backbone, keras.Model):
            raise ArgumentError("backbone", backbone, f"CaiTImageClassifier takes a CaiTBackbone, not a "
                                f"{type(backbone).__name__}", "e.g. CaiTBackbone.from_preset('cait_xxs24_224'), or "
                                "CaiTImageClassifier.from_preset(...) for the whole classifier", usage=True,
                                shown=f"<{type(backbone).__name__}>")
        try:
            backbone.input
        except (AttributeError, ValueError):  # was Keras' "The layer sequential has never been called"
            raise ArgumentError("backbone", backbone, "has no inputs: a model never built or called",
                                "give a CaiTBackbone, e.g. CaiTBackbone.from_preset('cait_xxs24_224')", usage=True,
                                shown=f"<{type(backbone).__name__} {backbone.name!r}>") from None
        check_options(CaiTImageClassifier, kwargs, (*KERAS_OPTIONS, "compile"))
        num_classes = checked_classes(num_classes, "num_classes")  # not Dense's `units`
        dropout = checked_number("dropout", dropout, lambda rate: 0 <= rate <= 1, "from 0 to 1", 0.1)  # not Dropout's `rate`
        head_dtype = checked_dtype(head_dtype, "head_dtype") or float32_if_mixed(backbone.dtype_policy)

        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.output_dropout = keras.layers.Dropout(dropout, dtype=head_dtype, name="output_dropout")
        # The head of every CaiT classifier: initialised as build_cait's and with_new_head's.
        self.output_dense = classifier_head(num_classes, activation, head_dtype, argument="activation")

        # === Functional Model ===
        inputs = self.backbone.input
        tokens = self.backbone(inputs)
        # The backbone's final LayerNorm is per token: its class token is the head's input.
        features = tokens[:, 0] if pooling == "token" else keras.ops.mean(tokens[:, 1:], axis=1)
        outputs = self.output_dense(self.output_dropout(features))
        # keras_hub.models.Task, skipping ImageClassifier's own graph (a 2D pooling).
        keras_hub.models.Task.__init__(self, inputs=inputs, outputs=outputs, **kwargs)

        # === Config ===
        self.num_classes = num_classes
        self.pooling = pooling
        self.activation = activation
        self.dropout = dropout

    def predict(self, x, *args, **kwargs):
        """Keras' `predict`; with its `CaiTImageConverter`, also of a list of images of any sizes."""
        # Images its converter cannot take, refused in one line: inside predict's tf.data pipeline the
        # converter's error came wrapped in a page of traceback.
        if isinstance(getattr(self.preprocessor, "image_converter", None), CaiTImageConverter) and (
                isinstance(x, (list, tuple, numpy.ndarray)) or keras.ops.is_tensor(x)):
            check_images(x, "x")
            shape = (len(x),) if isinstance(x, (list, tuple)) else tuple(x.shape)
            shown = f"<{type(x).__name__} of {len(x)} images>" if isinstance(x, (list, tuple)) else \
                f"<{type(x).__name__} of shape {shape}>"
            if len(shape) == 3:  # Keras took its rows for images
                raise ArgumentError("x", x, "is one image, not a batch of images", "give a batch of one: "
                                    "classifier.predict(image[None])", usage=True, shown=shown)
            if shape[0] == 0:  # was Keras' UnboundLocalError
                raise ArgumentError("x", x, "is a batch of 0 images", "give at least one", usage=True, shown=shown)
            if isinstance(x, (list, tuple)):  # Keras takes a list for several inputs, and of one shape
                images = [numpy.asarray(keras.ops.convert_to_numpy(image)) for image in x]
                if len({image.shape for image in images}) == 1:
                    x = numpy.stack(images)
                else:  # the converter resizes each: one batch of one image at a time
                    return numpy.concatenate([super(CaiTImageClassifier, self).predict(image[None], *args, **kwargs)
                                              for image in images])
        return super().predict(x, *args, **kwargs)

    def save_to_preset(self, preset_dir, max_shard_size=10):
        super().save_to_preset(preset_dir, max_shard_size=max_shard_size)
        presets.save_float_dtype(preset_dir)  # a mixed policy would not load back (keras-hub's loader)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """A released checkpoint by its timm name, or any keras-hub preset (folder, hf://, kaggle://).

        For `"cait_s24_224"` and the other released names (`keras_cait.hub.PRESETS`)
        the weights are timm's checkpoint, fetched as `weights="imagenet"` fetches it
        and put straight into this one model (`presets.load_weights`); with
        `weights="/path/to/model.safetensors"` (or a .pth, .pt or .weights.h5 file) they are
        read from that file, with no network. As for keras-hub's classifiers, passing
        `num_classes` gives a new, random head, except where the file holds a head of that
        many classes (a fine-tuned model's `save_weights`), which is loaded with it. `load_weights=False` builds the
        architecture with random weights and downloads nothing.
        """
        weights = presets.weights_argument(preset, load_weights, kwargs)
        if not presets.is_released(preset):
            return super().from_preset(preset, load_weights=load_weights, **kwargs)
        backbone = CaiTBackbone(**presets.backbone_config(preset), dtype=kwargs.pop("dtype", None))
        if "preprocessor" not in kwargs:
            kwargs["preprocessor"] = CaiTImageClassifierPreprocessor.from_preset(preset)
        # num_classes gives a new head, unless a weights file holds a head of that many classes
        new_head = "num_classes" in kwargs and not (
            weights not in (None, "imagenet") and presets.head_classes(weights) == kwargs["num_classes"])
        kwargs.setdefault("num_classes", 1000)
        classifier = cls(backbone=backbone, **kwargs)
        if weights is not None:
            presets.load_weights(backbone, preset, weights, head=None if new_head else classifier.output_dense)
        return classifier
