"""DeiT's learning rate: 5e-4 × batch / 512, linear warmup from 1e-6, cosine down to 1e-5."""

import math

import keras
import numpy as np
import pytest

from keras_cait.errors import ArgumentError
from keras_cait.training import scaled_learning_rate, warmup_cosine


def test_linear_scaling_with_the_global_batch():
    assert scaled_learning_rate(512) == pytest.approx(5e-4)
    assert scaled_learning_rate(1024) == pytest.approx(1e-3)
    assert scaled_learning_rate(64 * 8) == scaled_learning_rate(512)
    assert scaled_learning_rate(256, base=1e-3) == pytest.approx(5e-4)
    with pytest.raises(ArgumentError, match=r"^global_batch_size=0: must be a positive whole number; e.g. "
                       r"global_batch_size=512$"):
        scaled_learning_rate(0)
    with pytest.raises(ArgumentError, match=r"^reference_batch_size=0: must be a positive whole number"):
        scaled_learning_rate(64, reference_batch_size=0)


def expected(step, peak, total, warmup, start=1e-6, minimum=1e-5):
    if step < warmup:
        return start + (peak - start) * step / warmup
    progress = min(step - warmup, total - warmup) / (total - warmup)
    return minimum + (peak - minimum) * (1 + math.cos(math.pi * progress)) / 2


@pytest.mark.parametrize("step", [0, 1, 25, 49, 50, 51, 200, 525, 999, 1000, 5000])
def test_warmup_then_cosine(step):
    # 5 warmup epochs of 10 steps, 100 epochs in all, a global batch of 1024.
    schedule = warmup_cosine(scaled_learning_rate(1024), total_steps=1000, warmup_steps=50)
    value = float(keras.ops.convert_to_numpy(schedule(step)))
    assert value == pytest.approx(expected(step, 1e-3, 1000, 50), rel=1e-5, abs=1e-12)


def test_the_peak_the_midpoint_and_the_floor():
    schedule = warmup_cosine(1e-3, total_steps=1000, warmup_steps=50)

    def at(step):
        return float(keras.ops.convert_to_numpy(schedule(step)))

    assert at(0) == pytest.approx(1e-6)
    assert at(50) == pytest.approx(1e-3)
    assert at(525) == pytest.approx((1e-3 + 1e-5) / 2, rel=1e-4)
    assert at(1000) == pytest.approx(1e-5) and at(10_000) == pytest.approx(1e-5)


def test_without_warmup_it_starts_at_the_peak():
    schedule = warmup_cosine(1e-3, total_steps=100, warmup_steps=0, minimum=0.0)
    assert float(keras.ops.convert_to_numpy(schedule(0))) == pytest.approx(1e-3)
    assert float(keras.ops.convert_to_numpy(schedule(100))) == pytest.approx(0.0, abs=1e-12)


def test_bad_lengths_are_explained():
    with pytest.raises(ArgumentError, match=r"^warmup_steps=50: must be at least 0 and shorter than the run of "
                       r"total_steps=50; e.g. warmup_steps=2$"):
        warmup_cosine(1e-3, total_steps=50, warmup_steps=50)
    with pytest.raises(ArgumentError, match=r"^minimum=0.001: must be at least 0 and at most peak=1e-05; e.g. "
                       r"minimum=0.0$"):
        warmup_cosine(1e-5, total_steps=100, warmup_steps=5, minimum=1e-3)
    for bad in (dict(total_steps=0), dict(peak=float("nan")), dict(peak=float("inf")), dict(warmup_start=-1e-6)):
        with pytest.raises(ArgumentError, match=rf"^{next(iter(bad))}=.*: must be") as caught:
            warmup_cosine(**{**dict(peak=1e-3, total_steps=100, warmup_steps=5), **bad})
        assert caught.value.argument == next(iter(bad))


@pytest.mark.parametrize("epochs, warmup", [(300, 5), (30, 5), (12, 0)])
def test_epoch_cosine_is_timms_cosine_lr_scheduler_per_epoch(epochs, warmup):
    """DeiT's settings against timm's own scheduler, stepped as timm's train.py steps it."""
    import torch  # the [test] extra: missing is an error, not a skip
    from timm.scheduler import CosineLRScheduler

    from keras_cait.training.schedule import EpochCosine

    peak, steps = 1e-3, 7
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([parameter], lr=peak)
    reference = CosineLRScheduler(
        optimizer, t_initial=epochs, lr_min=1e-5, warmup_t=warmup, warmup_lr_init=1e-6,
        cycle_limit=1, t_in_epochs=True,
    )
    ours = EpochCosine(peak, epochs, steps, warmup_epochs=warmup)
    for epoch in range(epochs + 3):
        timm_rate = optimizer.param_groups[0]["lr"]
        for step in (epoch * steps, epoch * steps + steps - 1):
            value = float(keras.ops.convert_to_numpy(ours(step)))
            assert value == pytest.approx(timm_rate, rel=1e-5, abs=1e-12), (epoch, step)
        reference.step(epoch + 1)


def test_epoch_cosine_config_round_trip_and_errors():
    from keras_cait.training.schedule import EpochCosine

    schedule = EpochCosine(1e-3, 10, 5, warmup_epochs=2)
    clone = EpochCosine.from_config(schedule.get_config())
    assert float(clone(23)) == pytest.approx(float(schedule(23)))
    with pytest.raises(ArgumentError, match=r"^warmup_epochs=10: must be at least 0 and shorter than the run of "
                       r"epochs=10; e.g. warmup_epochs=5$"):
        EpochCosine(1e-3, 10, 5, warmup_epochs=10)
    for epochs, steps, argument in ((2.5, 5, "epochs"), (0, 5, "epochs"), (10, 0, "steps_per_epoch"),
                                    (10, 4.5, "steps_per_epoch")):
        with pytest.raises(ArgumentError, match=rf"^{argument}=.*: must be a positive whole number"):
            EpochCosine(1e-3, epochs, steps, warmup_epochs=0)
    assert EpochCosine(1e-3, 10.0, 5.0).get_config()["epochs"] == 10  # a config's 10.0 is 10 epochs


def test_a_rate_or_a_length_that_is_no_number_is_refused_naming_it():
    # A YAML config reads 1e-3 as the str '1e-3'. Before: TypeError: '<=' not supported between
    # instances of 'float' and 'str' (or 'int' and 'NoneType').
    from keras_cait.training.schedule import EpochCosine

    for call, line in [
        (lambda: warmup_cosine("1e-3", 1000, 50), "peak='1e-3': must be a number, not str; e.g. peak=0.001"),
        (lambda: warmup_cosine(1e-3, None, 50), "total_steps=None: must be a number, not NoneType; e.g. "
                                                 "total_steps=1000"),
        (lambda: EpochCosine(1e-3, "10", 5), "epochs='10': must be a number, not str; e.g. epochs=300"),
        (lambda: scaled_learning_rate("64"), "global_batch_size='64': must be a number, not str; e.g. "
                                             "global_batch_size=512"),
    ]:
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == line
    assert scaled_learning_rate(np.int64(512)) == pytest.approx(5e-4)  # numpy's numbers are numbers
