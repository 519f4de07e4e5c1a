"""The `trainable` flag of a layer that makes its sublayers in `build`."""


def set_trainable(layer, value):
    """`layer.trainable = value`, passed on to its sublayers and weights even where the flag is
    `value` already: on the TensorFlow backend that assignment is skipped as a no-op when the flag
    already equals `value` (TensorFlow's tracking: `self.x = self.x`), so the sublayers keep theirs."""
    type(layer).trainable.fset(layer, bool(value))


def sublayers_follow(layer):
    """Freezes what `layer.build` made (its sublayers and their weights) where `layer` is frozen.

    Keras sets `trainable=False` from a saved config in `__init__`, before `build` makes the
    sublayers, and a new sublayer is trainable: so a CaiT saved with its backbone frozen
    (`set_backbone_trainable(model, False)`) came back from `keras.models.load_model` and
    `keras.models.clone_model` with every block's weights trainable again, and `fit` trained them.
    Called last in every such `build`.
    """
    if not layer.trainable:
        set_trainable(layer, False)
