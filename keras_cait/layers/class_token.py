"""ClassToken: the learned class embedding that enters at class attention."""

import keras
from keras import ops

from keras_cait.layers.initializers import linear_kernel


@keras.saving.register_keras_serializable(package="keras_cait")
class ClassToken(keras.layers.Layer):
    """Returns one learned token x_class per sample of the batch.

    In CaiT the class token is not part of the self-attention stage: it joins
    only at the class-attention blocks (Sec. 2.2), and it gets no position
    embedding. The reference names the parameter `cls_token`.

    Args:
        **kwargs: standard layer arguments.

    Shapes:
        input `(batch, tokens, channels)` (only its batch size and width are
        used); output `(batch, 1, channels)`.

    Example:
        patches = keras.random.normal((2, 196, 384))
        ClassToken()(patches).shape  # (2, 1, 384)
    """

    def build(self, input_shape):
        self.token = self.add_weight(
            name="token",
            shape=(1, 1, input_shape[-1]),
            initializer=linear_kernel(),
        )

    def call(self, inputs):
        token = ops.cast(self.token, inputs.dtype)
        return ops.broadcast_to(token, (ops.shape(inputs)[0], 1, inputs.shape[-1]))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1, input_shape[-1])
