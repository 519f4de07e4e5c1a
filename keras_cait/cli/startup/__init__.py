"""The `keras-cait` command's start-up, run by `import keras_cait` before Keras loads.

    interrupt   in the command's process, Ctrl-C while Keras and TensorFlow load ends it with
                the error contract's line, not a traceback from inside TensorFlow
    onednn      in the command's process, `TF_ENABLE_ONEDNN_OPTS=1` on every x86 CPU

Both do nothing in any other process (a script, a notebook) and import nothing heavy.
"""
