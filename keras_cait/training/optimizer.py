"""AdamW as DeiT/CaiT train with it, built from Keras core's AdamW."""

import numbers

from keras_cait.deprecation import renamed_keywords
from keras_cait.errors import ArgumentError, checked_bool, checked_number
from keras_cait.layers import ClassToken, PositionEmbedding
from keras_cait.models.surgery import check_model_object
from keras_cait.optimizers import AdamW
from keras_cait.training.knobs import DEIT

# The defaults are DeiT's recipe (keras_cait.training.knobs holds its values).
WEIGHT_DECAY = DEIT.weight_decay
EPSILON = DEIT.opt_eps  # Keras' AdamW default is 1e-7
EMA_MOMENTUM = DEIT.model_ema_decay


def _check_settings(**settings):
    """An `ArgumentError` naming the first of `settings` (name: (value, low, high, example)) that is
    no number (a str from a config, a bool) or is outside [low, high) (high None: no bound)."""
    for name, (value, low, high, example) in settings.items():
        checked_number(name, value, lambda v: low <= v < float("inf") and (high is None or v < high),
                       f"at least {low}" if high is None else f"in [{low}, {high})", example)


def _check_learning_rate(learning_rate):
    """A number must be finite and at least 0 (-1 and nan were taken: the run diverged or gave nan
    losses), a str (from a config) is refused; a schedule or a callable is Keras' to take."""
    if isinstance(learning_rate, (str, bytes, bool)) or learning_rate is None:
        raise ArgumentError("learning_rate", learning_rate, "must be a number or a schedule, not "
                            f"{type(learning_rate).__name__}", "e.g. learning_rate=5e-4, or "
                            "warmup_cosine(5e-4, total_steps, warmup_steps)", usage=True)
    if isinstance(learning_rate, numbers.Real) and not (0 <= learning_rate < float("inf")):
        raise ArgumentError("learning_rate", learning_rate, "must be a number of at least 0",
                            "e.g. learning_rate=5e-4", usage=True)


def _layers(layer):
    yield layer
    for sublayer in getattr(layer, "layers", ()):
        yield from _layers(sublayer)


def weight_decay_exclusions(model):
    """The variables of `model` that AdamW must not decay, as DeiT and timm choose them.

    timm's `param_groups_weight_decay` skips every parameter with at most one
    dimension (biases, LayerNorm gamma/beta, LayerScale gammas) and the model's
    `no_weight_decay()` set, which for CaiT is `pos_embed` and `cls_token`. Here
    that is every variable of rank <= 1 plus the weights of each
    `PositionEmbedding` and `ClassToken` layer, also inside nested models (a
    backbone under a new head). Frozen variables are listed too, so that the
    optimizer stays right when they are unfrozen.
    """
    excluded = [v for v in model.weights if len(v.shape) <= 1]
    for layer in _layers(model):
        if isinstance(layer, (PositionEmbedding, ClassToken)):
            excluded.extend(layer.weights)
    return excluded


@renamed_keywords(clipnorm=("global_clipnorm", "one norm over all the gradients, as timm's --clip-grad; "
                                                 "clipnorm clipped each variable's gradient on its own"))
def adamw(
    model,
    learning_rate,
    weight_decay=WEIGHT_DECAY,
    beta_1=DEIT.opt_betas[0],
    beta_2=DEIT.opt_betas[1],
    epsilon=EPSILON,
    global_clipnorm=None,
    use_ema=False,
    ema_momentum=EMA_MOMENTUM,
):
    """`keras.optimizers.AdamW` with DeiT's settings and weight-decay exclusions (an `AdamW` of this
    module, which keeps them when the model is saved with its optimizer).

    The decoupled decay `w <- w - lr * weight_decay * w` applies to the kernels
    only; biases, norms, LayerScale gammas, the position embedding and the class
    token are excluded (see `weight_decay_exclusions`). Under "mixed_float16",
    `model.compile` wraps this optimizer in a `LossScaleOptimizer` itself.

    Args:
        model: the model to train (its variables must exist: build it first).
        learning_rate: a float or a schedule, e.g. `warmup_cosine(...)`.
        weight_decay: DeiT's 0.05.
        beta_1, beta_2: Adam's moment decay rates (PyTorch's defaults, as DeiT).
        epsilon: DeiT's 1e-8.
        global_clipnorm: optional clip of the gradients' norm taken over all
            variables together, each gradient scaled by the same factor (timm's
            `--clip-grad`, `torch.nn.utils.clip_grad_norm_`; DeiT: none). Keras'
            `clipnorm` would clip each variable's gradient on its own. (Its old
            name `clipnorm=` means this, with a DeprecationWarning, until the next release.)
        use_ema: keep an exponential moving average of the weights (DeiT's
            `--model-ema`); `model.fit` copies the average into the model when
            training ends.
        ema_momentum: the average's decay per step (DeiT: 0.99996).

    Example:
        >>> model = keras_cait.CaiT_XXS24(weights=None)
        >>> lr = warmup_cosine(scaled_learning_rate(256), total_steps=1000, warmup_steps=50)
        >>> model.compile(optimizer=adamw(model, lr), loss="categorical_crossentropy")
    """
    check_model_object(model, "adamw")
    if not model.weights:
        raise ArgumentError("model", model, "has no variables yet, so adamw cannot tell which to decay",
                            "build it first: call it on a batch, or give it an input shape", usage=True,
                            shown=f"<{model.name}>")
    _check_settings(weight_decay=(weight_decay, 0, None, WEIGHT_DECAY), beta_1=(beta_1, 0, 1, DEIT.opt_betas[0]),
                    beta_2=(beta_2, 0, 1, DEIT.opt_betas[1]), epsilon=(epsilon, 0, None, EPSILON),
                    ema_momentum=(ema_momentum, 0, 1, EMA_MOMENTUM))
    if global_clipnorm is not None:
        _check_settings(global_clipnorm=(global_clipnorm, 0, None, 1.0))
    _check_learning_rate(learning_rate)
    use_ema = checked_bool("use_ema", use_ema, "True (keep an average of the weights) or False")
    optimizer = AdamW(
        excluded_paths=[variable.path for variable in weight_decay_exclusions(model)],
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        beta_1=beta_1,
        beta_2=beta_2,
        epsilon=epsilon,
        global_clipnorm=global_clipnorm,
        use_ema=use_ema,
        ema_momentum=ema_momentum,
    )
    return optimizer  # its build excludes them by path, the same whether made here or loaded
