"""Train a CaiT from scratch with the DeiT/CaiT recipe.

The same as `keras-cait train`. Run with --help for the flags and their defaults;
the README's "Training" section shows complete commands.
"""

from keras_cait.cli import runs

if __name__ == "__main__":
    runs.main("train")
