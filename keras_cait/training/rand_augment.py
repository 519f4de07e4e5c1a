"""RandAugment that computes only the ops it applies: Keras core's, without its 11-fold work.

Keras' `RandAugment` draws `num_ops` op indices per call, then computes all 11 of
its ops for each of them and keeps the drawn one with `where`: 22 image transforms
to apply 2. In tf.data, per image, that made RandAugment 90 % of DeiT's input
pipeline (docs/benchmarks.md, "Input pipeline"). This subclass keeps everything of
Keras' layer (its sub-layers, their random draws, ranges and order, its config)
and replaces only the selection: `keras.ops.switch` runs the drawn op alone
(`tf.switch_case` inside tf.data). Same seed, same images, bit for bit.

Its equalisation counts each channel's histogram with `bincount` wherever it runs on
TensorFlow (in tf.data, whatever the Keras backend). Keras' `Equalization` chooses by
the global backend, so under KERAS_BACKEND=jax its tf.data graph held JAX's 256-step
loop per channel (RandAugment traced to 22,922 ops instead of 1,460; 25 s of a tiny
model's pipeline set-up on a CPU), and ran it for every image.
"""

import keras


class _Equalization(keras.layers.Equalization):
    """Keras' `Equalization` whose histogram is TensorFlow's `bincount` when it runs on TensorFlow."""

    def _custom_histogram_fixed_width(self, values, value_range, nbins):
        if self.backend.name != "tensorflow":
            return super()._custom_histogram_fixed_width(values, value_range, nbins)
        low, high = (float(bound) for bound in value_range)
        numpy = self.backend.numpy
        bins = self.backend.cast((self.backend.cast(values, "float32") - low) * (nbins - 1) / (high - low),
                                 "int32")
        return numpy.bincount(numpy.reshape(numpy.clip(bins, 0, nbins - 1), [-1]), minlength=nbins)


@keras.saving.register_keras_serializable(package="keras_cait")
class RandAugment(keras.layers.RandAugment):
    """`keras.layers.RandAugment` that runs only the drawn ops; arguments as Keras'."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.equalization = _Equalization.from_config(self.equalization.get_config())

    def transform_images(self, images, transformation, training=True):
        images = self.backend.cast(images, self.compute_dtype)
        if not training:
            return images
        transforms = transformation["transforms"]

        def apply(name):
            layer = getattr(self, name)
            return lambda image: self.backend.cast(layer.transform_images(image, transforms[name]),
                                                   self.compute_dtype)

        # Keras' indices count `_AUGMENT_LAYERS` in order, as its `transforms` dict does.
        branches = [apply(name) for name in self._AUGMENT_LAYERS]
        for index in range(self.num_ops):
            images = self.backend.core.switch(transformation["layer_idxes"][index], branches, images)
        return images
