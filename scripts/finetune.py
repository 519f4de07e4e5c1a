"""Fine-tune a CaiT on a folder of images (transfer learning).

The same as `keras-cait finetune`. Run with --help for the flags and their defaults;
the README's "Training" section shows complete commands.
"""

from keras_cait.cli import runs

if __name__ == "__main__":
    runs.main("finetune")
