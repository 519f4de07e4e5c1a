"""keras_cait.layers.PositionEmbedding."""

import keras
import numpy as np
import pytest

from keras_cait.layers import PositionEmbedding
from keras_cait.models.architecture import build_cait
from tests.layers.reference import randomize


def test_position_embedding_adds_one_vector_per_grid_position():
    layer = PositionEmbedding((2, 3))
    x = np.random.RandomState(0).normal(size=(2, 6, 4)).astype("float32")
    layer.build(x.shape)
    randomize(layer)
    table = keras.ops.convert_to_numpy(layer.embeddings)
    assert table.shape == (1, 6, 4)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x)), x + table, rtol=1e-6)


def test_position_embedding_saved_for_one_grid_loads_resized_into_another(tmp_path):
    small = build_cait(embed_dim=32, depth=1, num_heads=2, init_values=0.1, input_shape=(64, 64, 3))
    randomize(small.get_layer("position_embedding"), seed=5)
    path = str(tmp_path / "small.weights.h5")
    small.save_weights(path)
    large = build_cait(embed_dim=32, depth=1, num_heads=2, init_values=0.1, input_shape=(96, 64, 3))
    large.load_weights(path)
    from keras_cait.layers.position_embedding import resize_position_embedding

    expected = resize_position_embedding(
        keras.ops.convert_to_numpy(small.get_layer("position_embedding").embeddings), (6, 4)
    )
    got = keras.ops.convert_to_numpy(large.get_layer("position_embedding").embeddings)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert got.shape == (1, 24, 32)


# Any patch grid, square or not: the embedding records its (rows, cols) with the
# weights, and a load resamples from that grid exactly as torch's bicubic does.
GRID_CHANGES = [((9, 16), (14, 14)), ((14, 20), (24, 24)), ((14, 14), (9, 16))]
PATCH = 16


def _model(grid, name="cait"):
    return build_cait(
        embed_dim=8, depth=1, num_heads=2, init_values=0.1, name=name,
        input_shape=(grid[0] * PATCH, grid[1] * PATCH, 3),
    )


def _table(model):
    return keras.ops.convert_to_numpy(model.get_layer("position_embedding").embeddings)


def _torch_bicubic(table, source, target):
    import torch
    import torch.nn.functional as F

    dim = table.shape[-1]
    grid = torch.from_numpy(table.astype("float64")).reshape(1, *source, dim).permute(0, 3, 1, 2)
    resized = F.interpolate(grid, size=target, mode="bicubic", align_corners=False)
    return resized.permute(0, 2, 3, 1).reshape(1, -1, dim).numpy()


def _assert_close(got, expected):
    assert got.shape == expected.shape
    error = np.max(np.abs(got - expected)) / np.max(np.abs(expected))
    assert error <= 1e-6, f"max |Δ| / max |torch| = {error:.1e}"


@pytest.mark.parametrize("source, target", GRID_CHANGES)
@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_weights_saved_on_any_grid_load_resampled_from_that_grid(tmp_path, source, target, suffix):
    saved = _model(source)
    randomize(saved.get_layer("position_embedding"), seed=3)
    path = str(tmp_path / f"saved{suffix}")
    saved.save_weights(path) if suffix == ".weights.h5" else saved.save(path)
    loaded = _model(target)
    loaded.load_weights(path)
    _assert_close(_table(loaded), _torch_bicubic(_table(saved), source, target))


def test_same_token_count_on_another_grid_is_resampled_not_copied(tmp_path):
    # 9×16 and 12×12 both have 144 positions: the table fits, but is not the same grid.
    saved = _model((9, 16))
    randomize(saved.get_layer("position_embedding"), seed=4)
    saved.save_weights(str(tmp_path / "w.weights.h5"))
    loaded = _model((12, 12))
    loaded.load_weights(str(tmp_path / "w.weights.h5"))
    _assert_close(_table(loaded), _torch_bicubic(_table(saved), (9, 16), (12, 12)))


def _forget_grid(path):
    """Makes `path` a .weights.h5 file as written before the grid was recorded."""
    import h5py

    with h5py.File(path, "a") as file:
        del file["layers/position_embedding/vars/grid_size"]


def test_weights_written_before_the_grid_record_load_as_before(tmp_path):
    path = str(tmp_path / "old.weights.h5")
    non_square = _model((9, 16))
    randomize(non_square.get_layer("position_embedding"), seed=5)
    non_square.save_weights(path)
    _forget_grid(path)
    same = _model((9, 16))
    same.load_weights(path)  # fits: copied as it is
    np.testing.assert_array_equal(_table(same), _table(non_square))

    square = _model((8, 8))
    randomize(square.get_layer("position_embedding"), seed=6)
    square.save_weights(path)
    _forget_grid(path)
    larger = _model((12, 12))
    larger.load_weights(path)  # another grid: resampled from the square it must be
    _assert_close(_table(larger), _torch_bicubic(_table(square), (8, 8), (12, 12)))


def test_a_table_that_fits_no_stated_grid_is_refused_naming_both_shapes(tmp_path):
    import h5py

    path = str(tmp_path / "w.weights.h5")
    _model((9, 16)).save_weights(path)
    with h5py.File(path, "a") as file:
        file["layers/position_embedding/vars/grid_size"][...] = [10, 16]
    with pytest.raises(ValueError, match=r"shape \(1, 144, 8\).*10×16"):
        _model((14, 14)).load_weights(path)

    _model((14, 20)).save_weights(path)
    _forget_grid(path)  # 280 positions, no grid stated and not a square
    with pytest.raises(ValueError, match=r"shape \(1, 280, 8\).*source_grid"):
        _model((14, 14)).load_weights(path)
