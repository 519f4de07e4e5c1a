"""The precision a run trains in: a Keras dtype policy, the fast one where the run is unless told."""

import keras

from keras_cait import cpu
from keras_cait.errors import Named, say
from keras_cait.training.run_errors import RunError

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def check_precision(precision, auto=False):
    """`precision`, after checking it is a dtype policy a run takes ("auto" too, with `auto`)."""
    allowed = ("auto", *PRECISIONS) if auto else PRECISIONS
    if precision not in allowed:
        raise RunError("precision", precision, f"must be one of {', '.join(allowed)}", usage=True)
    return precision


def resolved_precision(precision):
    """`precision` (checked), with "auto" resolved by `default_precision` and said."""
    precision, why = chosen_precision(precision)
    say_chosen(precision, why)
    return precision


def chosen_precision(precision):
    """(`precision`, None) for a policy given; for "auto", `default_precision()`'s (policy, why),
    said by `say_chosen` once nothing can refuse the run any more."""
    return (precision, None) if precision != "auto" else default_precision()


def say_chosen(precision, why):
    if why is not None:
        say(f"Precision {precision} ({why}; ", Named("precision"), " chooses another).")


def default_precision(gpus=None, cpu_flags=None):
    """(policy, why): the dtype policy a run trains in unless told: "mixed_float16" where Keras'
    backend sees a GPU, "mixed_bfloat16" on a CPU with bfloat16 units (AVX512_BF16 or AMX), else
    "float32" (a CPU without them emulates half precision, slower than float32)."""
    gpus = _gpus() if gpus is None else gpus
    if gpus:
        return "mixed_float16", f"{gpus} GPU(s)"
    flags = cpu.cpu_flags() if cpu_flags is None else cpu_flags
    units = sorted(flags & set(cpu.BFLOAT16_UNITS))
    if units:
        return "mixed_bfloat16", f"a CPU with bfloat16 units: {', '.join(unit.upper() for unit in units)}"
    return "float32", "a CPU without bfloat16 units and no GPU"


def _gpus():
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return sum(device.platform == "gpu" for device in jax.devices())
    if backend == "torch":
        import torch

        return torch.cuda.device_count()
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))
