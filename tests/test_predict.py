"""CaiTModel.predict: one in-memory batch skips Keras' data pipeline, with Keras' results and progress bar."""

import keras
import numpy as np
import pytest

from keras_cait.models.architecture import CaiTModel
from tests.conftest import TINY_SIZE
from tests.layers.reference import randomize


@pytest.fixture(scope="module")
def model(tiny_cait):
    model = tiny_cait(classes=10)
    randomize(model, seed=0, scale=0.2)
    return model


def _images(n):
    return np.random.RandomState(n).uniform(0, 255, (n, TINY_SIZE, TINY_SIZE, 3)).astype("float32")


class KerasPredictSpy:
    """Counts calls of keras.Model.predict (Keras' own loop) while passing them on."""

    def __init__(self, monkeypatch):
        self.calls, original = 0, keras.Model.predict

        def predict(model, *args, **kwargs):
            self.calls += 1
            return original(model, *args, **kwargs)

        monkeypatch.setattr(keras.Model, "predict", predict)


def test_builder_returns_a_cait_model(model):
    assert type(model) is CaiTModel and isinstance(model, keras.Model)


@pytest.mark.large
@pytest.mark.parametrize("n, batch_size", [(1, None), (3, None), (4, 4)])
def test_one_batch_gives_keras_outputs_without_keras_loop(model, monkeypatch, n, batch_size):
    images = _images(n)
    expected = keras.Model.predict(model, images, batch_size=batch_size, verbose=0)
    spy = KerasPredictSpy(monkeypatch)
    for x in (images, keras.ops.convert_to_tensor(images)):
        outputs = model.predict(x, batch_size=batch_size, verbose=0)
        assert isinstance(outputs, np.ndarray)
        np.testing.assert_array_equal(outputs, expected)
    assert spy.calls == 0


@pytest.mark.parametrize(
    "arguments",
    [dict(batch_size=2), dict(steps=1), dict(callbacks=[keras.callbacks.Callback()])],
    ids=["more-than-one-batch", "steps", "callbacks"],
)
def test_anything_else_is_keras_predict(model, monkeypatch, arguments):
    images = _images(3)
    expected = keras.Model.predict(model, images, verbose=0, **arguments)
    spy = KerasPredictSpy(monkeypatch)
    np.testing.assert_array_equal(model.predict(images, verbose=0, **arguments), expected)
    assert spy.calls == 1


def test_progress_bar_as_keras_shows_it(model, capsys):
    model.predict(_images(1), verbose=0)
    assert capsys.readouterr().out == ""
    model.predict(_images(1), verbose=1)
    assert "1/1" in capsys.readouterr().out


def test_keras_file_round_trip_keeps_the_class(model, tmp_path):
    path = str(tmp_path / "cait.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is CaiTModel
    np.testing.assert_array_equal(loaded.predict(_images(2), verbose=0), model.predict(_images(2), verbose=0))
