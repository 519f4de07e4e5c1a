"""The initialisation of timm's CaiT (`Cait.__init__` and `_init_weights`) from Keras core.

    Linear weights, pos_embed, cls_token   trunc_normal_(std=.02)  -> `linear_kernel()`
    Linear biases                          zeros                   (Keras' default)
    LayerNorm                              ones / zeros            (Keras' default)
    patch convolution (weight and bias)    PyTorch's Conv2d default -> `torch_default_uniform(fan_in)`
"""

import contextlib
import math
import random

import keras

LINEAR_STD = 0.02


def linear_kernel():
    """timm's `trunc_normal_(w, std=.02)`, which is N(0, 0.02²).

    timm cuts at `a=-2, b=2` in absolute units, i.e. at ±100 standard deviations,
    where no float sample ever lands; so the distribution is the plain normal
    and Keras' `RandomNormal` draws it. Keras' `TruncatedNormal` would cut at
    ±2σ (±0.04), giving a std of 0.0176 and no weight beyond 0.04.
    """
    return keras.initializers.RandomNormal(stddev=LINEAR_STD)


def torch_default_uniform(fan_in):
    """PyTorch's default init of a Conv2d/Linear weight and bias: U(±1/√fan_in).

    (`kaiming_uniform_(a=√5)` for the weight has exactly this bound.) timm's
    CaiT leaves its patch convolution at this default.
    """
    bound = 1.0 / math.sqrt(fan_in)
    return keras.initializers.RandomUniform(-bound, bound)


@contextlib.contextmanager
def python_generator_kept():
    """Layers made inside leave Python's global generator as the caller had it.

    Keras draws a seed from `random` for each random initialiser or layer it makes. Where the
    weights or the randomness come from elsewhere (a `.keras` file's weights, a copy of a model,
    a stream drawing from its own `seed`), those draws would only move the caller's generator: what
    a training after `keras.utils.set_random_seed` draws would then depend on the call."""
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)
