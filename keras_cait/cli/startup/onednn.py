"""oneDNN's CPU kernels for TensorFlow in the `keras-cait` command, on every x86 CPU.

TensorFlow runs its CPU matmuls, convolutions and their fusions in oneDNN only on CPUs with
AVX-512 VNNI or newer; on the others (AVX2 CPUs among them) it runs Eigen's, unless
`TF_ENABLE_ONEDNN_OPTS=1` is set before TensorFlow loads. On a 2-core AVX2 EPYC, oneDNN's
kernels made CaiT's float32 training step 1.4x as fast (docs/benchmarks.md, "Levers").

So `import keras_cait` sets that variable first, in the `keras-cait` process only (its console
script or `python -m keras_cait.cli`, as `keras_cait.cli.startup.interrupt` tells it), on x86 only,
and only where the environment does not set it already: `TF_ENABLE_ONEDNN_OPTS=0` keeps Eigen.
A script or notebook that imports keras_cait is left as TensorFlow decides: a process-wide
setting is its owner's to make (docs/training.md says how).

This module imports nothing heavy: it runs before Keras is imported.
"""

import os
import platform

from keras_cait.cli.startup.interrupt import is_the_command

VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
X86 = ("x86_64", "amd64", "i386", "i686")


def use_onednn_in_the_command():
    """`TF_ENABLE_ONEDNN_OPTS=1` in the `keras-cait` process on an x86 CPU, unless already set."""
    if is_the_command() and platform.machine().lower() in X86 and VARIABLE not in os.environ:
        os.environ[VARIABLE] = "1"
