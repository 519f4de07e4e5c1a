"""The optimizer `keras_cait.training.adamw` returns, loaded with `import keras_cait` alone.

A model compiled with it and saved with `model.save` holds it; its class is registered here, on
Keras core only, so that `keras.models.load_model` finds it without `keras_cait.training` (which
loads TensorFlow).
"""

import keras


@keras.saving.register_keras_serializable(package="keras_cait")
class AdamW(keras.optimizers.AdamW):
    """Keras' AdamW that keeps the variables it does not decay in its config, by their paths.

    Keras' `exclude_from_weight_decay(var_list=...)` holds the variables themselves, which a saved
    optimizer does not keep: a model compiled with `adamw`, saved with `model.save` and loaded back
    decayed its biases, norms, LayerScale gammas and position embedding from then on, silently.
    `excluded_paths`: the `variable.path` of each variable not to decay (`adamw` gives them).
    """

    def __init__(self, *args, excluded_paths=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.excluded_paths = sorted(excluded_paths)
        self._excluded = set(self.excluded_paths)

    def build(self, var_list):
        # The variables of `excluded_paths` join those `exclude_from_weight_decay` was given (none in a
        # loaded optimizer), before Keras' build, after which the exclusions are fixed.
        given = getattr(self, "_exclude_from_weight_decay", set())
        self.exclude_from_weight_decay(var_list=[variable for variable in var_list if variable.path in self._excluded])
        self._exclude_from_weight_decay |= given
        super().build(var_list)

    def get_config(self):
        return {**super().get_config(), "excluded_paths": self.excluded_paths}
