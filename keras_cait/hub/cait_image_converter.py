"""`CaiTImageConverter`: 0..255 images of any size -> the CaiT's normalised input."""

import keras
import keras_hub
import numpy

from keras_cait.errors import ArgumentError, Named
from keras_cait.hub.cait_backbone import CaiTBackbone
from keras_cait.hub import presets
from keras_cait.preprocessing import IMAGENET_MEAN, IMAGENET_STD

# x / 255 normalised with the ImageNet mean and std, as one multiply and one add.
SCALE = tuple(1.0 / (255.0 * std) for std in IMAGENET_STD)
OFFSET = tuple(-mean / std for mean, std in zip(IMAGENET_MEAN, IMAGENET_STD))


def _check_per_channel(argument, value):
    """`scale` or `offset`: a number, or 3 numbers (one per RGB channel); else an `ArgumentError` naming
    it here, not a TypeError of `call` on the first batch."""
    array = numpy.asarray(value) if not isinstance(value, (str, bytes)) else None
    if array is None or array.dtype.kind not in "iuf" or array.shape not in ((), (3,)) \
            or not numpy.all(numpy.isfinite(array)):
        raise ArgumentError(argument, value, "must be a finite number or 3 of them, one per RGB channel",
                            ["e.g. ", Named("scale", shown="1 / 255"), " and ", Named("offset", 0.0),
                             " for 0..1 inputs; leave both out for the ImageNet mean and std"], usage=True)


_TAKES = ("CaiTImageConverter takes RGB images, channels last, (height, width, 3) or a batch "
          "(batch, height, width, 3), or a list of such images")


def check_images(images, argument="images"):
    """What the static shapes of `images` (an array, a tensor, a list of images) say, checked before
    Keras' call, which rewraps an error of `call` in a RuntimeError or a page of context: not RGB
    channels last, or an image without pixels, is an `ArgumentError` naming `argument`. A ragged
    batch or a graph's unknown sizes pass, to be checked as they are transformed."""
    if type(images).__name__ == "RaggedTensor":
        return
    listed = isinstance(images, (list, tuple))
    for image in images if listed else [images]:
        shape = tuple(image.shape) if hasattr(image, "shape") else numpy.shape(image)
        shown = f"<{type(images).__name__} {'holding an image ' if listed else ''}of shape {shape}>"
        if len(shape) not in ((3,) if listed else (3, 4)) or shape[-1] not in (3, None):
            raise ArgumentError(argument, images, _TAKES, "convert grey or RGBA images to RGB first (PIL: "
                                "image.convert('RGB'))", usage=True, shown=shown)
        if 0 in shape[-3:-1]:
            raise ArgumentError(argument, images, "an image without pixels", "give images of at least 1x1 pixels",
                                usage=True, shown=shown)


def _evaluation_transform(images, image_size, crop_pct):
    """One image (h, w, 3), a batch, a list of images or a ragged batch -> (…, H, W, 3) float32."""
    import tensorflow as tf

    from keras_cait.images.evaluation_transform import evaluation_transform

    def one(image):
        if isinstance(image, tf.RaggedTensor):  # a row of a ragged batch
            image = image.to_tensor()
        return evaluation_transform(image, image_size, crop_pct)

    if isinstance(images, (list, tuple)):
        return tf.stack([one(tf.convert_to_tensor(image)) for image in images])
    if not isinstance(images, tf.RaggedTensor):
        images = tf.convert_to_tensor(keras.ops.convert_to_numpy(images)
                                      if not tf.is_tensor(images) else images)
        if images.shape.rank == 3:
            return one(images)
    if images.shape.rank != 4 or images.shape[-1] not in (3, None):  # ragged: (batch, None, None, None)
        raise ValueError(f"images of shape {images.shape}: {_TAKES}.")
    spec = tf.TensorSpec((*image_size, 3), tf.float32)
    return tf.map_fn(one, images, fn_output_signature=spec)


@keras.saving.register_keras_serializable(package="keras_cait")
class CaiTImageConverter(keras_hub.layers.ImageConverter):
    """The reference evaluation transform, then the ImageNet mean and std.

    For RGB images of any size, values 0..255: the shorter side is resized
    bicubically (antialiased) to `image_size / crop_pct`, keeping the aspect
    ratio, the centre `image_size` is cropped (timm's evaluation transform for
    CaiT's checkpoints, `keras_cait.images.evaluation_transform`, the same code as
    `keras_cait.preprocessing.load_image` and the SavedModel's serving
    signature), and `x · scale + offset` = `(x / 255 - mean) / std`.

    Args:
        image_size: `(height, width)` of the model input, or its side (`224`).
        crop_pct: the fraction of the resized image the crop keeps (CaiT: 1.0).
        scale, offset: per channel; default to the ImageNet mean and std.

    Example:
        converter = CaiTImageConverter(image_size=(224, 224))
        converter(np.random.randint(0, 256, (375, 500, 3)))  # (224, 224, 3)
    """

    backbone_cls = CaiTBackbone

    def __init__(self, image_size=(224, 224), crop_pct=1.0, scale=SCALE, offset=OFFSET, **kwargs):
        for name, fixed in dict(interpolation="bicubic", antialias=True, crop_to_aspect_ratio=True,
                                pad_to_aspect_ratio=False).items():
            if kwargs.setdefault(name, fixed) != fixed:
                raise ValueError(
                    f"{name}={kwargs[name]!r}: CaiTImageConverter always runs the reference "
                    f"evaluation transform ({name}={fixed!r}); leave it out."
                )
        if image_size is None:
            raise ValueError("image_size=None: CaiTImageConverter needs the model's (height, width), e.g. (224, 224).")
        from keras_cait.images.evaluation_transform import check_crop_pct, target_size

        check_crop_pct(crop_pct)
        _check_per_channel("scale", scale)
        _check_per_channel("offset", offset)
        super().__init__(image_size=target_size(image_size), scale=scale, offset=offset, **kwargs)
        self.crop_pct = crop_pct

    def __call__(self, *args, **kwargs):
        check_images(args[0] if args else kwargs.get("inputs"))
        return super().__call__(*args, **kwargs)

    def call(self, inputs):
        import tensorflow as tf

        images = _evaluation_transform(inputs, self.image_size, self.crop_pct)
        images = images * tf.constant(self.scale, tf.float32) + tf.constant(self.offset, tf.float32)
        images = tf.cast(images, self.compute_dtype)
        if keras.config.backend() != "tensorflow" and tf.executing_eagerly():
            return keras.ops.convert_to_tensor(images.numpy())
        return images

    def get_config(self):
        config = super().get_config()
        config["crop_pct"] = self.crop_pct
        return config

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """The converter of a released checkpoint (`"cait_s24_384"`), or of any keras-hub preset."""
        if not presets.is_released(preset):
            return super().from_preset(preset, **kwargs)
        return cls(**{"image_size": presets.image_size(preset), **kwargs})  # image_size= as the backbone's image_shape=
