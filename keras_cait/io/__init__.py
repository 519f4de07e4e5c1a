"""Files and streams that keras_cait writes.

    atomic   `written_atomically`, `write_text`: a file or folder appears whole or not at all
             (exports, run records, figures, downloads), and what killed writers left is removed;
             `unwritable`: why a folder cannot be written in, checked before any work
    stderr   TensorFlow's start-up INFO lines kept out of `import keras_cait`; `flush_stderr` and
             `write_all` for code that redirects file descriptor 2 (keras_cait.images.decoder_messages)

Both import nothing heavy: `import keras_cait` runs `stderr` before Keras loads.
"""
