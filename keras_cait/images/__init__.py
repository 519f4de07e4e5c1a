"""Images in and out of a CaiT: decoding files and the evaluation transform.

    evaluation_transform   decoding (JPEG, PNG, GIF, BMP, WebP, sizes read from the header
                           first), and the reference's resize and centre crop (TensorFlow ops):
                           the one transform of `load_image`, the runs' data, `serving_bytes`
                           and the keras-hub image converter
    decoder_messages       libjpeg's and the decoders' own lines kept off standard error while
                           images are decoded, every other line passed on

The public entry points are `keras_cait.preprocessing.load_image` and `preprocess_input`. This
package imports nothing itself: `evaluation_transform` loads TensorFlow, `decoder_messages` not.
"""
