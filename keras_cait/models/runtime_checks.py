"""The image check at run time, for TensorFlow graphs whose static shape leaves it open.

`keras_cait.models.inputs.check_images` reads static shapes and adds no op. A
`tf.data` pipeline built with `from_generator` and a spec such as
`(None, None, None, 3)` traces the model with height and width unknown, so the
static check cannot see a 16×64 image sent to a 32×32 model (same number of
patches: it would run and answer wrongly). For such graphs only, the check is
an assert inside the graph, before the first layer reads the images.
"""

from keras_cait.io.stderr import load_tensorflow

tf = load_tensorflow()  # on JAX or PyTorch, its first import: without TensorFlow's start-up lines


def checked_images(images, expected, takes):
    """`images`, run only after an assert that their shape is `(batch ≥ 1, *expected)`.

    Args:
        images: a symbolic `tf.Tensor` whose static shape leaves some of it open.
        expected: `(height, width, channels)` the model takes.
        takes: the sentence that says so, e.g. "tiny takes images of shape (batch, 32, 32, 3)".

    Raises (when run) InvalidArgumentError naming the shape it got and the fix.
    """
    height, width, channels = expected
    shape = tf.shape(images, out_type=tf.int64)
    padded = tf.pad(shape, [[0, 4]])  # any rank: four entries to compare
    fits = (
        tf.equal(tf.size(shape), 4)
        & (padded[0] > 0)
        & tf.reduce_all(tf.equal(padded[1:4], tf.constant(expected, tf.int64)))
    )
    message = tf.strings.join([
        "images of shape [", tf.strings.reduce_join(tf.strings.as_string(shape), separator=", "),
        f"]: {takes}, at least one; resize and centre-crop them to {height}×{width} with "
        f"{channels} channels (grayscale: np.repeat(images, 3, axis=-1); RGBA: images[..., :3]).",
    ])
    with tf.control_dependencies([tf.debugging.Assert(fits, [message], summarize=1)]):
        return tf.identity(images)
