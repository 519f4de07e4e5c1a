"""RandAugment that computes only the ops it applies: Keras core's, without its 11-fold work.

Keras' `RandAugment` draws `num_ops` op indices per call, then computes all 11 of
its ops for each of them and keeps the drawn one with `where`: 22 image transforms
to apply 2. In tf.data, per image, that made RandAugment 90 % of DeiT's input
pipeline (docs/benchmarks.md, "Input pipeline"). This subclass keeps everything of
Keras' layer (its sub-layers, their random draws, ranges and order, its config)
and replaces only the selection: `keras.ops.switch` runs the drawn op alone
(`tf.switch_case` inside tf.data). Same seed, same images, bit for bit.
"""

import keras


@keras.saving.register_keras_serializable(package="keras_cait")
class RandAugment(keras.layers.RandAugment):
    """`keras.layers.RandAugment` that runs only the drawn ops; arguments as Keras'."""

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
