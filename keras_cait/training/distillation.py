"""Knowledge distillation as DeiT trains with it (facebookresearch/deit `losses.py`).

All ten released CaiT checkpoints (`fb_dist_in1k`) were distilled: the paper
trains with DeiT's hard distillation from a RegNetY-16GF teacher (82.9 % top-1).
CaiT has no distillation token, so its one class-token output serves both terms.
The teacher's weights are the user's to supply: any Keras model that maps the
same input batch to class scores (give `teacher_preprocessing` if it expects
other inputs than the student's 0..255 images).

    loss = (1 - α) · base(y, s) + α · D(s, t)
    D_soft = τ² · Σ KL(softmax(t / τ) ‖ softmax(s / τ)) / (batch · classes)
    D_hard = cross_entropy(s, argmax t)

with s, t the student's and teacher's scores, `base` the compiled loss (the
cross-entropy on the mixup/cutmix soft targets). DeiT divides the soft term by
batch × classes (PyTorch's legacy KL reduction), which is kept here.
"""

import keras
from keras import ops

from keras_cait.errors import ArgumentError, Named, checked_bool, checked_number

DISTILLATION_TYPES = ("none", "soft", "hard")


def _log_probabilities(scores, from_logits, tau=1.0):
    """log softmax(logits / τ); from probabilities p, log p differs from the logits by a
    per-row constant, which the softmax removes."""
    scores = ops.cast(scores, "float32")
    logits = scores if from_logits else ops.log(ops.maximum(scores, 1e-30))
    return ops.log_softmax(logits / tau, axis=-1)


def distillation_term(student, teacher, distillation_type, tau=1.0,
                      student_from_logits=True, teacher_from_logits=True):
    """DeiT's distillation term D(s, t) (see the module docstring); a float32 scalar."""
    if distillation_type == "hard":
        teacher_class = ops.argmax(teacher, axis=-1)
        log_student = _log_probabilities(student, student_from_logits)
        picked = ops.take_along_axis(log_student, teacher_class[:, None], axis=-1)
        return -ops.mean(picked)
    log_student = _log_probabilities(student, student_from_logits, tau)
    log_teacher = _log_probabilities(teacher, teacher_from_logits, tau)
    divergence = ops.sum(ops.exp(log_teacher) * (log_teacher - log_student))
    return divergence * (tau * tau) / ops.cast(ops.size(log_student), "float32")


def _classes(model):
    """The number of class scores `model` gives, where its output shape says so (else None)."""
    try:
        return model.outputs[0].shape[-1]
    except (AttributeError, IndexError, TypeError, ValueError):  # e.g. a subclassed, unbuilt model
        return None


def _check_same_classes(student, teacher, model=None):
    if student is not None and teacher is not None and student != teacher:
        shown = f"<model {model.name!r}>" if isinstance(model, keras.Model) else "<teacher>"
        raise ArgumentError("teacher", None, f"gives {teacher} class scores and the student {student}: distillation "
                            "compares them class by class", ["give a teacher for the same classes (e.g. fine-tune "
                            f"its head to these {student} classes first), or ", Named("distillation_type", "none")],
                            usage=True, shown=shown)


class Distiller(keras.Model):
    """Trains `student` with DeiT's distillation from a frozen `teacher`, from `model.fit`.

    The loss is `(1 - alpha) · compiled loss + alpha · D(student, teacher)` (see
    the module docstring); it is computed in `compute_loss`, which `fit` calls
    on every backend. The teacher is frozen and runs in inference mode on
    `teacher_preprocessing(images)`; predictions, metrics and evaluation are the
    student's. Save `distiller.student`, the model being trained.

    Args:
        student: the model to train (e.g. a CaiT).
        teacher: any Keras model giving class scores for the same classes.
        distillation_type: "hard" (the paper's), "soft" or "none".
        alpha: weight of the distillation term (DeiT `--distillation-alpha 0.5`).
        tau: temperature of the soft term (DeiT `--distillation-tau 1.0`).
        teacher_preprocessing: optional function from the student's input batch
            to the teacher's (resizing, another normalisation, ...).
        student_from_logits, teacher_from_logits: whether the outputs are
            logits (else probabilities, e.g. a softmax head).

    Example:
        >>> distiller = Distiller(keras_cait.CaiT_S24(weights=None), teacher)
        >>> distiller.compile(optimizer=adamw(distiller.student, lr),
        ...                   loss="categorical_crossentropy")
        >>> distiller.fit(stream, epochs=300)
    """

    def __init__(self, student, teacher, distillation_type="hard", alpha=0.5, tau=1.0,
                 teacher_preprocessing=None, student_from_logits=False,
                 teacher_from_logits=False, **kwargs):
        super().__init__(**kwargs)
        if distillation_type not in DISTILLATION_TYPES:
            raise ArgumentError("distillation_type", distillation_type,
                                f"must be one of {', '.join(map(repr, DISTILLATION_TYPES))} (DeiT's --distillation-type)",
                                ["e.g. ", Named("distillation_type", "hard")], usage=True)
        # A str from a config ('0.5') failed the range check with a bare TypeError.
        checked_number("alpha", alpha, lambda v: 0 <= v <= 1, "from 0 to 1", 0.5)
        checked_number("tau", tau, lambda v: v > 0, "above 0", 1.0)
        # A str 'no' is truthy: probabilities would be taken for logits.
        student_from_logits = checked_bool("student_from_logits", student_from_logits,
                                           "True (the student outputs logits) or False (probabilities)")
        teacher_from_logits = checked_bool("teacher_from_logits", teacher_from_logits,
                                           "True (the teacher outputs logits) or False (probabilities)")
        for argument, model in (("student", student), ("teacher", teacher)):
            if not isinstance(model, keras.Model):
                raise ArgumentError(
                    argument, model, f"Distiller takes a Keras model, not a {type(model).__name__}",
                    "build it first, e.g. keras.applications.ResNet50() or keras.models.load_model('teacher.keras')"
                    if argument == "teacher" else "e.g. keras_cait.CaiT_S24(weights=None)",
                    usage=True, shown=None if isinstance(model, str) else f"<{type(model).__name__}>")
        if teacher_preprocessing is not None and not callable(teacher_preprocessing):  # failed in fit, each step
            raise ArgumentError("teacher_preprocessing", teacher_preprocessing, "must be a function of the student's "
                                f"input batch, not a {type(teacher_preprocessing).__name__}",
                                "e.g. lambda images: keras.ops.image.resize(images, (299, 299)), or None", usage=True)
        _check_same_classes(_classes(student), _classes(teacher), teacher)
        self.student = student
        self.teacher = teacher
        self.teacher.trainable = False
        self.distillation_type = distillation_type
        self.alpha = float(alpha)
        self.tau = float(tau)
        self.teacher_preprocessing = teacher_preprocessing
        self.student_from_logits = bool(student_from_logits)
        self.teacher_from_logits = bool(teacher_from_logits)

    def call(self, inputs, training=None):
        return self.student(inputs, training=training)

    def save(self, filepath, *args, **kwargs):
        """Refused before anything is written (Keras raised NotImplementedError after creating an empty
        file): a Distiller wraps a training run, and its teacher and `teacher_preprocessing` are the
        user's; what to keep is the model it trains, `distiller.student.save(filepath)`."""
        raise ArgumentError(None, filepath, "A Distiller is not saved whole (its teacher and teacher_preprocessing "
                            "are yours to keep)", f"save the model it trains: distiller.student.save({filepath!r})",
                            usage=True)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        base = super().compute_loss(x, y, y_pred, sample_weight, training)
        if self.distillation_type == "none" or not training:
            return base  # DeiT evaluates with the plain cross-entropy
        teacher_inputs = x if self.teacher_preprocessing is None else self.teacher_preprocessing(x)
        teacher = ops.stop_gradient(self.teacher(teacher_inputs, training=False))
        _check_same_classes(y_pred.shape[-1], teacher.shape[-1], self.teacher)  # a teacher of unknown output
        term = distillation_term(
            y_pred, teacher, self.distillation_type, self.tau,
            self.student_from_logits, self.teacher_from_logits,
        )
        return ops.cast(base, "float32") * (1.0 - self.alpha) + term * self.alpha
