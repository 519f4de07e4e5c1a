"""Distillation against DeiT's `DistillationLoss` (facebookresearch/deit losses.py).

timm does not ship DeiT's losses.py, so `deit_distillation_loss` below is its
`forward`, written with the same torch.nn.functional calls as DeiT's code, for a
model without a distillation token (the class-token output serves both terms); its
base criterion is timm's own `SoftTargetCrossEntropy`, as DeiT's with mixup.
"""

import os

import keras
import numpy as np
import pytest

from keras_cait.errors import ArgumentError
from keras_cait.training import adamw
from keras_cait.training.distillation import Distiller

import torch  # the [test] extra: missing is an error, not a skip
F = torch.nn.functional
CLASSES = 10


def deit_distillation_loss(outputs, teacher_outputs, labels, distillation_type, alpha, tau):
    from timm.loss import SoftTargetCrossEntropy

    outputs, teacher_outputs, labels = (torch.from_numpy(a) for a in (outputs, teacher_outputs, labels))
    outputs_kd = outputs
    base_loss = SoftTargetCrossEntropy()(outputs, labels)
    if distillation_type == "none":
        return float(base_loss)
    if distillation_type == "soft":
        T = tau
        distillation_loss = F.kl_div(
            F.log_softmax(outputs_kd / T, dim=1),
            F.log_softmax(teacher_outputs / T, dim=1),
            reduction="sum",
            log_target=True,
        ) * (T * T) / outputs_kd.numel()
    elif distillation_type == "hard":
        distillation_loss = F.cross_entropy(outputs_kd, teacher_outputs.argmax(dim=1))
    return float(base_loss * (1 - alpha) + distillation_loss * alpha)


def scores(seed, batch=8):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, (batch, CLASSES)).astype("float32")
    targets = rng.dirichlet(np.full(CLASSES, 0.3), batch).astype("float32")  # mixup-like
    return logits, targets


def passthrough():
    """A 'teacher' whose scores are its inputs, so the test chooses them."""
    inputs = keras.Input((CLASSES,))
    return keras.Model(inputs, keras.layers.Identity()(inputs))


@pytest.mark.parametrize(
    "distillation_type, alpha, tau",
    [("hard", 0.5, 1.0), ("soft", 0.5, 1.0), ("soft", 0.3, 3.0), ("hard", 0.9, 1.0),
     ("none", 0.5, 1.0)],
)
@pytest.mark.parametrize("from_logits", [True, False], ids=["logits", "probabilities"])
def test_loss_is_deits_distillation_loss_on_the_same_logits(distillation_type, alpha, tau, from_logits):
    student, targets = scores(0)
    teacher, _ = scores(1)
    expected = deit_distillation_loss(student, teacher, targets, distillation_type, alpha, tau)

    to_output = (lambda z: z) if from_logits else (lambda z: keras.ops.softmax(z, axis=-1))
    distiller = Distiller(
        passthrough(), passthrough(), distillation_type, alpha, tau,
        teacher_preprocessing=to_output,
        student_from_logits=from_logits, teacher_from_logits=from_logits,
    )
    distiller.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=from_logits))
    distiller.build((None, CLASSES))
    got = distiller.compute_loss(x=teacher, y=targets, y_pred=to_output(student), training=True)
    assert float(got) == pytest.approx(expected, rel=1e-5)
    # Evaluation is the plain cross-entropy, as DeiT's evaluate().
    evaluated = distiller.compute_loss(x=teacher, y=targets, y_pred=to_output(student), training=False)
    base = deit_distillation_loss(student, teacher, targets, "none", alpha, tau)
    assert float(evaluated) == pytest.approx(base, rel=1e-5)


@pytest.mark.large
def test_a_small_cait_learns_the_digits_from_a_small_frozen_teacher(tiny_cait):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images[:256, :, :, None], np.ones((1, 4, 4, 3))) * (255 / 16)
    images = images.astype("float32")
    labels = keras.utils.to_categorical(digits.target[:256], CLASSES)

    keras.utils.set_random_seed(0)
    teacher = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                                keras.layers.Flatten(), keras.layers.Dense(CLASSES)])
    teacher.compile(optimizer=keras.optimizers.Adam(1e-2),
                    loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    teacher.fit(images, labels, epochs=5, batch_size=32, verbose=0)
    teacher_weights = [w.copy() for w in teacher.get_weights()]

    student = tiny_cait(classes=CLASSES)
    distiller = Distiller(student, teacher, "hard", teacher_from_logits=True)
    distiller.compile(optimizer=adamw(student, 1e-3), loss="categorical_crossentropy")
    before = distiller.evaluate(images, labels, verbose=0)
    history = distiller.fit(images, labels, epochs=3, batch_size=32, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert distiller.evaluate(images, labels, verbose=0) < before
    for kept, weight in zip(teacher_weights, teacher.get_weights()):
        np.testing.assert_array_equal(kept, weight)

    # The loss fit minimised is DeiT's, on the student's and the teacher's outputs.
    batch = images[:32]
    student_probabilities = keras.ops.convert_to_numpy(student(batch, training=False))
    teacher_logits = keras.ops.convert_to_numpy(teacher(batch))
    got = distiller.compute_loss(x=batch, y=labels[:32], y_pred=student_probabilities)
    expected = deit_distillation_loss(
        np.log(student_probabilities), teacher_logits, labels[:32], "hard", 0.5, 1.0
    )
    assert float(got) == pytest.approx(expected, rel=1e-4)


def test_a_teacher_or_student_that_is_no_model_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^teacher='resnet50': Distiller takes a Keras model, not a str; build it"):
        Distiller(passthrough(), "resnet50")
    with pytest.raises(ValueError, match=r"^student=<NoneType>: Distiller takes a Keras model, not a NoneType"):
        Distiller(None, passthrough())
    # Taken, then `TypeError: 'str' object is not callable` on fit's first step.
    with pytest.raises(ValueError, match=r"^teacher_preprocessing='resize': must be a function of the student's "
                                         r"input batch, not a str; e\.g\. lambda images"):
        Distiller(passthrough(), passthrough(), teacher_preprocessing="resize")


def test_bad_settings_are_explained():
    with pytest.raises(ValueError, match="distillation_type='medium'"):
        Distiller(passthrough(), passthrough(), "medium")
    with pytest.raises(ValueError, match="alpha=1.5"):
        Distiller(passthrough(), passthrough(), "soft", alpha=1.5)


@pytest.mark.parametrize("setting, message", [
    ({"alpha": "0.5"}, "alpha='0.5': must be a number from 0 to 1, not str; e.g. alpha=0.5"),
    ({"alpha": 1.5}, "alpha=1.5: must be a number from 0 to 1; e.g. alpha=0.5"),
    ({"tau": None}, "tau=None: must be a number above 0, not NoneType; e.g. tau=1.0"),
    ({"tau": 0}, "tau=0: must be a number above 0; e.g. tau=1.0"),
    ({"distillation_type": "Hard"}, "distillation_type='Hard': must be one of 'none', 'soft', 'hard' (DeiT's "
                                    "--distillation-type); e.g. distillation_type='hard'"),
    ({"student_from_logits": "no"}, "student_from_logits='no': must be True (the student outputs logits) or False "
                                    "(probabilities), not str"),
    ({"teacher_from_logits": "False"}, "teacher_from_logits='False': must be True (the teacher outputs logits) or "
                                       "False (probabilities), not str"),
])
def test_a_setting_from_a_config_is_refused_naming_it(setting, message):
    """alpha='0.5' (a YAML str) was a bare TypeError from `0 <= alpha`; student_from_logits='no'
    was truthy, so the student's probabilities were taken for logits."""
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as raised:
        Distiller(passthrough(), passthrough(), **{"distillation_type": "soft", **setting})
    assert str(raised.value) == message
    assert raised.value.argument == next(iter(setting))


@pytest.mark.parametrize("teacher_classes", [10, 3])
def test_a_teacher_of_another_class_count_is_refused_naming_both(tiny_cait, teacher_classes):
    student = tiny_cait(classes=5)

    teacher = tiny_cait(classes=teacher_classes)
    with pytest.raises(ArgumentError) as raised:
        Distiller(student, teacher, "soft")

    assert raised.value.argument == "teacher"  # a bare ValueError before, naming no argument
    assert str(raised.value).startswith(f"teacher=<model {teacher.name!r}>: gives {teacher_classes} class scores and "
                                        "the student 5: distillation compares them class by class; give a teacher")


def test_saving_a_distiller_is_refused_before_a_file_is_written_and_says_what_to_save(tiny_cait, tmp_path):
    """Keras raised NotImplementedError after creating an empty file; the model to keep is the student."""
    from keras_cait.errors import ArgumentError

    distiller = Distiller(tiny_cait(classes=3), tiny_cait(classes=3))
    path = str(tmp_path / "distiller.keras")
    with pytest.raises(ArgumentError, match=r"^A Distiller is not saved whole .*; save the model it trains: "
                                            r"distiller\.student\.save\('.*distiller\.keras'\)$"):
        distiller.save(path)
    assert not os.listdir(tmp_path)
