"""keras_cait.inspection.visualize and `keras-cait attention`: the paper's attention figures."""

import re
import sys

import numpy as np
import pytest
from PIL import Image

from keras_cait import cli
from keras_cait.errors import ArgumentError
from keras_cait.inspection.attention import AttentionMaps
from keras_cait.models.architecture import build_cait
from keras_cait.inspection.visualize import (
    class_attention_figure,
    saliency_figure,
    saliency_map,
    save_figure,
)

GRID = (4, 4)
PATCH = 8


def synthetic_maps(batch=3, heads=4, blocks=2, seed=0):
    """Class-attention maps as attention_maps returns them, softmax-normalised at random."""
    rng = np.random.default_rng(seed)
    grids, self_weights = [], []
    for _ in range(blocks):
        logits = rng.normal(0, 2, (batch, heads, 1 + GRID[0] * GRID[1]))
        weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        self_weights.append(weights[:, :, 0].astype("float32"))
        grids.append(weights[:, :, 1:].reshape((batch, heads) + GRID).astype("float32"))
    return AttentionMaps(grids, self_weights, {}, GRID)


def images_for(maps):
    batch = maps.class_attention[0].shape[0]
    return np.random.default_rng(1).uniform(0, 255, (batch, GRID[0] * PATCH, GRID[1] * PATCH, 3))


class TestSaliencyMap:
    def test_peaks_in_the_patch_with_the_largest_head_average(self):
        maps = synthetic_maps(batch=4, seed=2)
        saliency = saliency_map(maps, (32, 32))

        assert saliency.shape == (4, 32, 32)
        np.testing.assert_allclose(saliency.max(axis=(1, 2)), 1.0)
        np.testing.assert_allclose(saliency.min(axis=(1, 2)), 0.0, atol=1e-6)
        mean = maps.class_attention[0].mean(axis=1)
        for sample in range(4):
            peak = np.unravel_index(saliency[sample].argmax(), (32, 32))
            best_patch = np.unravel_index(mean[sample].argmax(), GRID)
            assert (peak[0] // PATCH, peak[1] // PATCH) == best_patch
        # The head average differs from every single head here, so using one head would fail.
        single_heads = maps.class_attention[0].reshape(4, 4, -1).argmax(-1)
        assert (single_heads != mean.reshape(4, -1).argmax(-1)[:, None]).any(axis=1).all()

    def test_follows_the_chosen_block(self):
        maps = synthetic_maps(seed=3)
        first, second = saliency_map(maps, (32, 32), block=0), saliency_map(maps, (32, 32), block=1)
        assert not np.allclose(first, second)
        swapped = AttentionMaps(maps.class_attention[::-1], maps.class_token_weight, {}, GRID)
        np.testing.assert_allclose(saliency_map(swapped, (32, 32)), second)


class TestFigures:
    def test_class_attention_figure_has_the_image_and_every_head_of_every_block(self):
        maps = synthetic_maps(heads=4, blocks=2)
        figure = class_attention_figure(images_for(maps), maps, sample=1)
        assert len(figure.axes) == 2 * (1 + 4)
        titles = [ax.get_title() for ax in figure.axes]
        assert titles[:5] == ["class attention 1", "head 1", "head 2", "head 3", "head 4"]
        assert titles[5] == "class attention 2"
        # Each head panel shows the image and the map of that head of that image over it.
        head_panel = figure.axes[5 + 3]
        np.testing.assert_array_equal(head_panel.images[1].get_array(), maps.class_attention[1][1, 2])

    def test_saliency_figure_has_an_image_and_an_overlay_per_sample(self):
        maps = synthetic_maps(batch=5)
        figure = saliency_figure(images_for(maps), maps, samples=[0, 3, 4], labels=["a", "b", "c"])
        assert len(figure.axes) == 2 * 3
        assert [ax.get_title() for ax in figure.axes[:3]] == ["a", "b", "c"]
        overlay = figure.axes[3 + 1].images[1].get_array()
        np.testing.assert_allclose(overlay, saliency_map(maps, (32, 32))[3])
        assert len(saliency_figure(images_for(maps), maps).axes) == 2 * 5

    def test_grey_and_normalised_images_are_drawn(self, tmp_path):
        maps = synthetic_maps(batch=1)
        grey = np.random.default_rng(4).normal(0, 1, (1, 32, 32, 1))
        figure = class_attention_figure(grey, maps)
        shown = figure.axes[0].images[0].get_array()
        assert shown.shape == (32, 32) and 0 <= shown.min() and shown.max() <= 1
        save_figure(figure, tmp_path / "grey.png")

    def test_mismatched_images_and_samples_are_refused(self):
        maps = synthetic_maps(batch=3)
        with pytest.raises(ValueError, match=r"images of shape \(2, 32, 32, 3\).*batch of 3 images"):
            class_attention_figure(images_for(maps)[:2], maps)
        # IndexErrors still (as they were), and ArgumentErrors naming the argument: the message was
        # "sample 0: the maps hold images 0 to 2" for sample='0', as if 0 were out of range.
        lines = {
            "samples=[0, 3]": (dict(samples=[0, 3]), "samples=[0, 3]: holds 3, no index of the 3 images the maps "
                               "hold; e.g. samples=[0] (indices 0 to 2)"),
            "samples=[0.5]": (dict(samples=[0.5]), "samples=[0.5]: holds 0.5, no index of the 3 images the maps "
                              "hold (an index is an integer, not a float); e.g. samples=[0] (indices 0 to 2)"),
        }
        for arguments, line in lines.values():
            with pytest.raises(IndexError) as raised:
                saliency_figure(images_for(maps), maps, **arguments)
            assert str(raised.value) == line and raised.value.argument == "samples"
        for sample, kind in ((3, ""), ("0", " (an index is an integer, not a str)")):
            with pytest.raises(ArgumentError) as raised:
                class_attention_figure(images_for(maps), maps, sample=sample)
            assert isinstance(raised.value, IndexError) and raised.value.argument == "sample"
            assert str(raised.value) == (f"sample={sample!r}: is no index of the 3 images the maps hold{kind}; "
                                         "e.g. sample=0 (indices 0 to 2)")

    def test_a_block_or_labels_the_maps_cannot_show_are_refused_naming_them(self):
        maps = synthetic_maps(batch=3, blocks=2)
        for block in (2, -3, 1.0, True):
            with pytest.raises(ArgumentError, match=rf"^block={re.escape(repr(block))}: is no index of the 2 "
                               r"class-attention blocks the maps hold; e\.g\. block=0 \(indices 0 to 1\)$") as raised:
                saliency_figure(images_for(maps), maps, block=block)
            assert isinstance(raised.value, IndexError)
        with pytest.raises(IndexError, match="^block=2: "):
            saliency_map(maps, (32, 32), block=2)
        with pytest.raises(ValueError, match=r"labels=\['a', 'b'\]: 2 titles for 3 images shown; give one per"):
            saliency_figure(images_for(maps), maps, labels=["a", "b"])
        with pytest.raises(ArgumentError, match=r"^labels='ab': must be a list of titles, one per image shown, not a "
                           r"str; e\.g\. labels=\['ab', 'ab'\]$"):  # 'a' and 'b' were the titles
            saliency_figure(images_for(maps), maps, samples=[0, 1], labels="ab")
        figure = saliency_figure(images_for(maps), maps, samples=[2], labels=(name for name in ["c"]))
        assert figure.axes[0].get_title() == "c"

    @pytest.mark.parametrize("samples, message", [
        (0, "samples=0: must be a list of image indices; e.g. samples=[0], or leave it out for every image"),
        (np.int64(2), "samples=np.int64(2): must be a list of image indices; e.g. samples=[2], or leave it out for "
                      "every image"),
        ("01", "samples='01': must be a list of image indices; e.g. samples=[0, 1], or leave it out for every image"),
        ([], "samples=[]: names no image to show; e.g. samples=[0], or leave it out for every image"),
    ])
    def test_samples_that_are_no_list_of_indices_are_refused_naming_them(self, samples, message):
        """samples=0 was a TypeError from list(0), '01' its characters taken as indices, [] matplotlib's
        'Number of columns must be a positive integer, not 0'."""
        from keras_cait.errors import ArgumentError

        maps = synthetic_maps(batch=3)
        with pytest.raises(ArgumentError) as raised:
            saliency_figure(images_for(maps), maps, samples=samples)
        assert str(raised.value) == message and raised.value.argument == "samples"
        assert len(saliency_figure(images_for(maps), maps, samples=np.array([2, 0])).axes) == 4

    def test_maps_that_are_no_attention_maps_and_a_size_that_is_no_pair_are_refused_naming_them(self):
        """Before: the two swapped, or maps=None, an AttributeError ('numpy.ndarray' object has no attribute
        'class_attention'); saliency_map(maps, 32) a bare TypeError from keras."""
        from keras_cait.errors import ArgumentError

        maps = synthetic_maps(batch=3)
        images = images_for(maps)
        allowed = "images first, then maps: e.g. saliency_figure(images, keras_cait.attention_maps(model, images))"
        for draw, message in [
            (lambda: saliency_figure(maps, images), "maps=<ndarray of shape (3, 32, 32, 3)>: must be the AttentionMaps "
             "of keras_cait.attention_maps, not ndarray (images and maps are swapped); " + allowed),
            (lambda: class_attention_figure(maps, images), "maps=<ndarray of shape (3, 32, 32, 3)>: must be the "
             "AttentionMaps of keras_cait.attention_maps, not ndarray (images and maps are swapped); " + allowed),
            (lambda: saliency_figure(images, None), "maps=None: must be the AttentionMaps of keras_cait.attention_maps, "
             "not NoneType; " + allowed),
        ]:
            with pytest.raises(ArgumentError) as raised:
                draw()
            assert raised.value.argument == "maps" and str(raised.value) == message
        with pytest.raises(ArgumentError) as raised:
            saliency_map(maps, 32)
        assert raised.value.argument == "size" and str(raised.value) == (
            "size=32: must be the (height, width) of the images, two positive integers; e.g. size=(224, 224), or "
            "images.shape[1:3]")
        assert saliency_map(maps, [8, 6]).shape == (3, 8, 6)

    def test_missing_matplotlib_says_how_to_install_it(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
        maps = synthetic_maps()
        with pytest.raises(ImportError, match=r'pip install "keras-cait\[plots\]"'):
            saliency_figure(images_for(maps), maps)


def test_save_figure_writes_a_png_and_leaves_no_partial_file(tmp_path):
    maps = synthetic_maps()
    path = save_figure(saliency_figure(images_for(maps), maps), tmp_path / "saliency.png")
    with Image.open(path) as png:
        assert png.format == "PNG" and png.size[0] > png.size[1]
    assert [p.name for p in tmp_path.iterdir()] == ["saliency.png"]


def test_save_figure_refuses_a_folder_or_another_format_and_keeps_the_folder(tmp_path):
    from keras_cait.errors import ArgumentError

    maps = synthetic_maps()
    figure = saliency_figure(images_for(maps), maps)
    folder = tmp_path / "figures"
    folder.mkdir()
    (folder / "kept.txt").write_text("mine")
    with pytest.raises(ArgumentError) as raised:
        save_figure(figure, folder)
    assert str(raised.value) == (
        f"path={str(folder)!r}: is a folder, which save_figure would replace with one PNG file; "
        f"give a file in it, e.g. {str(folder / 'saliency.png')!r}")
    assert raised.value.argument == "path" and (folder / "kept.txt").read_text() == "mine"
    with pytest.raises(ArgumentError) as raised:
        save_figure(figure, tmp_path / "saliency.jpg")
    assert str(raised.value) == (f"path={str(tmp_path / 'saliency.jpg')!r}: save_figure writes a PNG, so the file "
                                 "must end in .png; e.g. 'saliency.png'")
    assert raised.value.argument == "path" and not (tmp_path / "saliency.jpg").exists()
    with pytest.raises(ArgumentError) as raised:
        save_figure("saliency.png", figure)
    assert str(raised.value).startswith("path=<Figure size") and raised.value.argument == "path"
    assert str(raised.value).endswith(": must be a file path ending in .png, not Figure; "
                                      "e.g. save_figure(figure, 'saliency.png')")


def test_save_figure_refuses_a_path_inside_a_file_and_a_figure_that_is_none(tmp_path):
    """os.makedirs' raw FileExistsError, and a bare AttributeError on savefig."""
    from keras_cait.errors import ArgumentError

    maps = synthetic_maps()
    figure = saliency_figure(images_for(maps), maps)
    (tmp_path / "notes").write_text("mine")
    with pytest.raises(ArgumentError) as raised:
        save_figure(figure, tmp_path / "notes" / "saliency.png")
    assert str(raised.value) == (f"path={str(tmp_path / 'notes' / 'saliency.png')!r}: is inside the file "
                                 f"{tmp_path / 'notes'}, not a folder; choose another folder")
    for thing, shown in ((None, "None"), ("saliency", "'saliency'"), (maps, "<AttentionMaps>")):
        with pytest.raises(ArgumentError) as raised:
            save_figure(thing, tmp_path / "saliency.png")
        assert str(raised.value) == (f"figure={shown}: must be a matplotlib Figure, not a {type(thing).__name__}; "
                                     "e.g. save_figure(saliency_figure(images, maps), 'saliency.png')")
    assert [p.name for p in tmp_path.iterdir()] == ["notes"] and (tmp_path / "notes").read_text() == "mine"


@pytest.mark.parametrize("dpi", ["100", 0, -5, None, True, float("nan")])
def test_save_figure_refuses_a_dpi_that_is_no_positive_number_naming_it(tmp_path, dpi):
    """Before: dpi='100' failed inside matplotlib (TypeError: can't multiply sequence by non-int of type 'numpy.float64')."""
    from keras_cait.errors import ArgumentError

    maps = synthetic_maps()
    figure = saliency_figure(images_for(maps), maps)
    with pytest.raises(ArgumentError) as raised:
        save_figure(figure, tmp_path / "saliency.png", dpi=dpi)
    assert raised.value.argument == "dpi" and str(raised.value) == (
        f"dpi={dpi!r}: must be a positive number of dots per inch; e.g. dpi=100 (the default) or dpi=200 for print")
    assert list(tmp_path.iterdir()) == []
    assert save_figure(figure, tmp_path / "saliency.png", dpi=50.5).exists()


class TestAttentionCommand:
    @pytest.fixture(scope="class")
    def photo(self, tmp_path_factory):
        path = tmp_path_factory.mktemp("photo") / "photo.jpg"
        pixels = np.random.default_rng(5).integers(0, 256, (60, 80, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
        return path

    def test_writes_the_heads_and_saliency_pngs(self, tmp_path, photo, capsys):
        # A saved .keras model (as the demo writes); CaiT names such as cait_s24_224
        # go through the same code after `keras-cait predict`'s model builder.
        model = build_cait(embed_dim=32, depth=1, num_heads=2, init_values=0.1, patch_size=8,
                           input_shape=(32, 32, 3), classes=3)
        model.save(tmp_path / "model.keras")
        out = tmp_path / "maps.png"
        cli.main(["attention", str(photo), "--out", str(out), "--model", str(tmp_path / "model.keras")])

        with Image.open(out) as heads, Image.open(tmp_path / "maps_saliency.png") as saliency:
            heads.load()
            saliency.load()
            # 2 blocks × (image + 2 heads); image over overlay.
            assert heads.size[0] / heads.size[1] == pytest.approx(3 / 2)
            assert saliency.size[0] / saliency.size[1] == pytest.approx(1 / 2)
        assert "maps_saliency.png" in capsys.readouterr().out

    def test_refuses_an_output_that_is_not_png(self, tmp_path, photo):
        with pytest.raises(SystemExit, match=r"--out .*maps.jpg.* must end in .png"):
            cli.main(["attention", str(photo), "--out", str(tmp_path / "maps.jpg")])
