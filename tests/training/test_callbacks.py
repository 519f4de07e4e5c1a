"""keras_cait.training.callbacks: what a run writes beside its model (here: ema.keras)."""

import keras
import numpy as np
import tensorflow as tf

from keras_cait.training import resume
from keras_cait.training.callbacks import run_callbacks
from keras_cait.training.recipe import RECIPES


class Trajectory(keras.callbacks.Callback):
    """The trainable weights after every training step."""

    def on_train_begin(self, logs=None):
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append([np.array(weight) for weight in self.model.trainable_weights])


def test_ema_keras_holds_the_moving_average_of_the_weights_at_the_recipe_s_decay(tmp_path):
    """With the recipe's EMA, ema.keras holds Keras' moving average of the weights after each step at
    the recipe's decay d (the first step's weights, then avg <- d avg + (1 - d) w), and the model keeps
    its raw weights. timm's ModelEmaV2 starts from the weights before the first step instead: the same
    once d^steps is negligible (at DeiT's 0.99996, after a few hundred thousand steps)."""
    rng = np.random.default_rng(4)
    decay = float(rng.uniform(0.3, 0.9))
    batch, steps, epochs = 8, 3, 2
    recipe = RECIPES["transfer"].replace(model_ema=True, model_ema_decay=decay, lr=float(rng.uniform(0.01, 0.05)),
                                         lr_batch=batch, epochs=epochs)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(5, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="predictions")(hidden))
    model.compile(optimizer=recipe.optimizer(model, batch, steps), loss="categorical_crossentropy", jit_compile=False)
    features = rng.normal(size=(batch * steps, 6)).astype("float32")
    labels = np.eye(3, dtype="float32")[rng.integers(0, 3, batch * steps)]
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch).repeat(epochs)
    callbacks, backup = run_callbacks(str(tmp_path), str(tmp_path / "backup"), 100, monitor="loss")
    trajectory = Trajectory()
    resume.fit(model, data.skip, epochs, steps, backup=backup, callbacks=[*callbacks, trajectory], verbose=0)

    assert len(trajectory.steps) == steps * epochs
    average = trajectory.steps[0]
    for weights in trajectory.steps[1:]:
        average = [decay * mean + (1 - decay) * weight for mean, weight in zip(average, weights)]
    raw = trajectory.steps[-1]
    assert max(np.abs(mean - weight).max() for mean, weight in zip(average, raw)) > 1e-3  # they differ
    ema = keras.saving.load_model(tmp_path / "ema.keras")
    for saved, mean in zip(ema.trainable_weights, average, strict=True):
        np.testing.assert_allclose(np.array(saved), mean, rtol=1e-5, atol=1e-7)
    for weight, value in zip(model.trainable_weights, raw, strict=True):
        np.testing.assert_array_equal(np.array(weight), value)


def test_moving_average_file_keeps_the_trained_weights_in_a_plain_fit(tmp_path):
    """docs/training.md's advice for a `deit` recipe in one's own `model.fit`: without the callback
    Keras leaves the average in the model, which over a short fit is still about the first step's
    weights (Keras starts it there; DeiT's decay spans ~25,000 steps)."""
    from keras_cait.training.callbacks import MovingAverageFile

    rng = np.random.default_rng(5)
    batch, steps = 8, 3
    recipe = RECIPES["deit"].replace(lr=0.05, lr_batch=batch, epochs=2, warmup_epochs=0.0)
    features = rng.normal(size=(batch * steps, 6)).astype("float32")
    labels = np.eye(3, dtype="float32")[rng.integers(0, 3, batch * steps)]
    trained, trajectories = {}, {}
    for kept in (False, True):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6,))
        model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="predictions")(inputs))
        model.compile(optimizer=recipe.optimizer(model, batch, steps), loss="categorical_crossentropy")
        trajectories[kept] = Trajectory()
        callbacks = [trajectories[kept]] + ([MovingAverageFile(str(tmp_path / "ema.keras"))] if kept else [])
        model.fit(features, labels, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        trained[kept] = [np.array(weight) for weight in model.trainable_weights]
    first, last = trajectories[False].steps[0], trajectories[False].steps[-1]
    assert max(np.abs(a - b).max() for a, b in zip(first, last)) > 1e-2  # training moved the weights
    for weight, value in zip(trained[False], first, strict=True):  # Keras': the average, about the first step
        np.testing.assert_allclose(weight, value, atol=1e-3)
    for weight, value in zip(trained[True], trajectories[True].steps[-1], strict=True):  # kept: the trained ones
        np.testing.assert_array_equal(weight, value)
    assert (tmp_path / "ema.keras").exists()
