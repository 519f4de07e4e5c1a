"""Top-1 / top-5 accuracy of a CaiT on a folder of images or a TFDS split.

The same as `keras-cait evaluate`. Run with --help for the flags and their defaults;
the README's "Training" section shows complete commands.
"""

from keras_cait.cli import runs

if __name__ == "__main__":
    runs.main("evaluate")
