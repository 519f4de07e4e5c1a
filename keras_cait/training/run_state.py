"""What a run sets for itself, and puts back: its seed, TensorFlow's op determinism and Keras' distribution.

A run's model takes its initial weights and its stochastic depth's generators from seeds that
Keras draws from Python's `random` as the layers are built; a run seeds it (and NumPy's global
generator) with its `seed`, and with `deterministic` turns TensorFlow's op determinism on.
A run with `strategy="dataparallel"` sets Keras' global distribution (`keras.distribution`).
`process_state_kept` puts each back as the caller left it when the run returns, on every exit
path (an error, a KeyboardInterrupt): a library call leaves the process as it found it. The
dtype policy is no setting of a run's at all: its models are built with theirs (`dtype=`), the
global policy is never set.
"""

import contextlib
import functools
import random

import keras
import numpy as np


def process_state_kept(run_function):
    """`run_function` with Python's and NumPy's global generators, TensorFlow's op determinism and
    Keras' distribution as the caller left them once it returns or raises."""

    @functools.wraps(run_function)
    def kept(*args, **kwargs):
        with _kept():
            return run_function(*args, **kwargs)

    return kept


@contextlib.contextmanager
def _kept():
    python, numpy, determinism = random.getstate(), np.random.get_state(), _op_determinism()
    distribution = keras.distribution.distribution()
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        if _op_determinism() != determinism:
            _set_op_determinism(determinism)
        if keras.distribution.distribution() is not distribution:  # strategy="dataparallel" sets Keras' own
            keras.distribution.set_distribution(distribution)


def seed(seed, deterministic=False):
    """Seeds the run's generators with `seed` (the model's initial weights are drawn from them), and
    with `deterministic` makes TensorFlow's ops deterministic, for the run only (`process_state_kept`)."""
    random.seed(seed)
    np.random.seed(seed)
    if deterministic:
        _set_op_determinism(True)


def _op_determinism():
    from tensorflow.python.framework import config  # TensorFlow exports the switch, not the state

    return config.is_op_determinism_enabled()


def _set_op_determinism(enabled):
    from tensorflow.python.framework import config

    if enabled:
        config.enable_op_determinism()
    else:
        config.disable_op_determinism()
