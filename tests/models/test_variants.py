"""keras_cait.models.variants: the variant table, the CaiT_* constructors made from it, and its copies in the docs.

Every test here runs over `VARIANTS`, so a new row is tested as the others are. Whether a row's
numbers are the reference's is checked here; whether keras_cait computes what timm computes for
the row is tests/test_parity.py's `test_every_variant_matches_timm_s_cait_built_from_its_row`.
"""

import functools
import inspect
import os
import pathlib
import pickle
import pydoc
import re
import socket

import numpy as np
import pytest

import keras_cait
from keras_cait.errors import ArgumentError
from keras_cait.models import variants
from keras_cait.models.variants import VARIANTS
from keras_cait.weights import CHECKPOINTS, load_weights_file
from keras_cait.weights.registry import HUB_URL_ENV

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
TABLE_PAGES = ("README.md", "docs/weights.md")
KERAS_APPLICATIONS_ARGUMENTS = ["include_top", "weights", "input_tensor", "input_shape", "pooling", "classes",
                                "classifier_activation"]

# The variants of the paper that timm does not define, and their LayerScale init, which no reference
# code states: that of the released models beside them (M24 as S24, XS36 as XXS36, S48 as S36 and M48).
# Their width and heads are those of timm's models of the same size, their depth their name's.
NOT_IN_TIMM = {"M24": 1e-5, "XS36": 1e-5, "S48": 1e-6}


def timm_archs(variant):
    import timm

    return timm.list_models(f"cait_{variant.lower()}_*")


@functools.cache
def architecture(arch):
    """(width, depth, heads, class-attention depth) of timm's model `arch`, built on the meta device (no memory)."""
    import timm

    model = timm.create_model(arch, device="meta")
    return model.embed_dim, len(model.blocks), model.blocks[0].attn.num_heads, len(model.blocks_token_only)


def reference_architecture(variant):
    """(width, depth, heads) of the variant as timm builds it; for a variant timm does not define, the
    width and heads of timm's variants of its size (XXS, XS, S, M) and the depth its name gives."""
    import timm

    size, depth = re.fullmatch(r"([A-Z]+)(\d+)", variant).groups()
    own = timm_archs(variant)
    archs = own or timm.list_models(f"cait_{size.lower()}[0-9]*")
    assert archs, f"{variant}: timm has no CaiT of size {size}; the test has no width and heads to compare with"
    found = {architecture(arch) for arch in archs}
    class_attention = {blocks for *_, blocks in found}
    assert class_attention == {2}, f"{archs}: {class_attention} class-attention blocks; keras_cait builds 2"
    widths_and_heads = {(width, heads) for width, _, heads, _ in found}
    assert len(widths_and_heads) == 1, f"{archs}: {found}"
    ((width, heads),) = widths_and_heads
    if own:
        depths = {timm_depth for _, timm_depth, _, _ in found}
        assert len(depths) == 1, f"{archs}: {found}"
        (depth,) = depths
    return width, int(depth), heads


def reference_init(variant):
    """The LayerScale init of timm's factories of `variant` (e.g. cait_s36_384), read from the
    gammas of a one-block model that the factory builds with its own init_values."""
    import timm

    archs = timm_archs(variant)
    if not archs:
        assert variant in NOT_IN_TIMM, (
            f"timm has no cait_{variant.lower()}_*: state its LayerScale init, and where it comes from, "
            "in NOT_IN_TIMM in tests/models/test_variants.py"
        )
        return NOT_IN_TIMM[variant]
    inits = set()
    for arch in archs:
        model = timm.create_model(arch, depth=1, embed_dim=16, num_heads=2, img_size=32, num_classes=2)
        gammas = [p for name, p in model.named_parameters() if name.rsplit(".", 1)[-1].startswith("gamma_")]
        inits |= {float(value) for gamma in gammas for value in gamma.detach().numpy()}
    assert len(inits) == 1, f"{archs}: LayerScale inits {inits}"
    return inits.pop()


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_row_is_the_reference_s_architecture(variant):
    """Width, depth and heads of the row are timm's (the parity test builds timm's model from the row,
    so a wrong number in the row would pass there)."""
    row = VARIANTS[variant]
    assert (row["embed_dim"], row["depth"], row["num_heads"]) == reference_architecture(variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_constructor_starts_layerscale_at_the_reference_s_init(variant, monkeypatch):
    """Every LayerScale γ of CaiT_<variant>(weights=None) starts at timm's init_values for that
    variant: 1e-6 for the deep S36, S48, M36 and M48, 1e-5 for the others. The constructor builds
    through build_cait, shrunk here to one block of width 2 × heads (an M48 would take 20 s)."""
    built = []

    def shrunk(**arguments):
        built.append(arguments)
        return build_cait(**{**arguments, "depth": 1, "embed_dim": 2 * arguments["num_heads"]})

    build_cait = variants.build_cait
    monkeypatch.setattr(variants, "build_cait", shrunk)
    model = getattr(keras_cait, f"CaiT_{variant}")(weights=None, input_shape=(32, 32, 3), classes=2)
    assert len(built) == 1, "the constructor no longer builds through variants.build_cait"
    gammas = [w for w in model.weights if w.path.endswith("layer_scale/gamma")]
    assert len(gammas) == 2 * (1 + 2)  # attention and MLP of one self-attention and two class-attention blocks
    init = reference_init(variant)
    for gamma in gammas:
        np.testing.assert_array_equal(np.asarray(gamma), np.float32(init), err_msg=gamma.path)


def test_keras_cait_exports_one_constructor_per_row_and_no_other():
    names = [f"CaiT_{variant}" for variant in VARIANTS]
    assert [name for name in keras_cait.__all__ if name.startswith("CaiT_")] == names
    assert sorted(name for name in dir(keras_cait) if name.startswith("CaiT_")) == sorted(names)
    assert sorted(name for name in dir(variants) if name.startswith("CaiT_")) == sorted(names)
    namespace = {}
    exec("from keras_cait import *", namespace)
    assert {name for name in namespace if name.startswith("CaiT_")} == set(names)


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_constructor_is_a_documented_function_of_its_row(variant):
    """A plain function as keras.applications' are: its name, the arguments users know, a docstring
    with the row's numbers and checkpoints that help() shows, and pickled by reference."""
    constructor = getattr(keras_cait, f"CaiT_{variant}")
    row = VARIANTS[variant]
    assert inspect.isfunction(constructor)
    assert constructor is getattr(variants, f"CaiT_{variant}")
    assert (constructor.__name__, constructor.__qualname__, constructor.__module__) == (
        f"CaiT_{variant}", f"CaiT_{variant}", "keras_cait.models.variants")
    parameters = inspect.signature(constructor).parameters
    assert list(parameters)[:7] == KERAS_APPLICATIONS_ARGUMENTS
    released = [arch for arch in CHECKPOINTS if arch.startswith(f"cait_{variant.lower()}_")]
    assert parameters["weights"].default == ("imagenet" if released else None)

    shown = pydoc.render_doc(constructor, renderer=pydoc.plaintext)
    assert f"CaiT_{variant}(include_top=True, weights=" in shown
    assert f'Instantiates CaiT-{variant} ("Going deeper with Image Transformers").' in shown
    numbers = f"{row['depth']} self-attention blocks with talking heads and LayerScale, then 2"
    assert numbers in shown and f"width {row['embed_dim']}, {row['num_heads']} heads, patch 16." in shown
    assert f"Released ImageNet checkpoints: {', '.join(released) or 'none'}" in shown
    assert pickle.loads(pickle.dumps(constructor)) is constructor


def table_block(page):
    text = (REPOSITORY / page).read_text(encoding="utf-8")
    found = re.search(r"<!-- variants:start -->\n(.*?)\n<!-- variants:end -->", text, re.S)
    assert found, f"{page} has no <!-- variants:start --> ... <!-- variants:end --> block"
    return found.group(1)


@pytest.mark.parametrize("page", TABLE_PAGES)
def test_the_variant_table_of_the_page_is_the_code_s_table(page):
    assert table_block(page) == variants.markdown_table(), (
        f"{page}'s variant table differs from VARIANTS and the checkpoint registry; "
        "run `python scripts/variant_tables.py` to write it"
    )


def test_the_code_s_table_has_each_row_with_its_numbers_and_checkpoints():
    rows = [line.strip("|").split("|") for line in variants.markdown_table().splitlines()[2:]]
    assert [cells[0].strip() for cells in rows] == [f"`CaiT_{variant}`" for variant in VARIANTS]
    for cells, (variant, row) in zip(rows, VARIANTS.items()):
        depth, width, heads, init, released = (cell.strip() for cell in cells[1:])
        assert (depth, int(width), int(heads), float(init)) == (f"{row['depth']} + 2", row["embed_dim"],
                                                               row["num_heads"], row["init_values"])
        resolutions = [str(CHECKPOINTS[arch]["resolution"]) for arch in CHECKPOINTS
                       if arch.split("_")[1] == variant.lower()]
        assert released == (", ".join(resolutions) or "—")


# === Mistakes in a constructor's arguments: one error naming the value and what is allowed ===
# Apart from the one about the network, every error comes before any download: `urlopen` fails the
# test if called, and the cache stays empty.


@pytest.fixture
def offline(no_network, keras_cache):
    yield
    assert not os.path.exists(keras_cache) or not os.listdir(keras_cache)


@pytest.fixture
def tiny_checkpoint(timm_reference):
    """A valid timm checkpoint, of a CaiT that is none of the released variants."""
    return timm_reference.save(timm_reference.tiny_model())


@pytest.mark.parametrize("weights", [None, "imagenet"])
@pytest.mark.parametrize(
    "input_shape, suggestion",
    [((230, 230, 3), "e.g. (224, 224, 3)"), ((224, 210, 3), "e.g. (224, 208, 3)")],
)
def test_sides_must_be_multiples_of_16(offline, weights, input_shape, suggestion):
    with pytest.raises(ValueError) as error:
        keras_cait.CaiT_XXS24(weights=weights, input_shape=input_shape)

    message = str(error.value)
    assert message.startswith(f"input_shape={input_shape}: ")
    assert "multiples of the patch size 16" in message
    assert suggestion in message


@pytest.mark.parametrize("weights", ["imagenet", "checkpoint"])
def test_pretrained_weights_need_3_channels(offline, tiny_checkpoint, weights):
    weights = tiny_checkpoint if weights == "checkpoint" else weights

    with pytest.raises(ValueError, match=r"input_shape=\(224, 224, 1\): pretrained weights need 3 "
                                         r"channels .*\(224, 224, 3\); for 1 channels use weights=None, "
                                         r"include_preprocessing=False"):
        keras_cait.CaiT_XXS24(weights=weights, input_shape=(224, 224, 1))


def test_imagenet_normalisation_needs_3_channels(offline):
    with pytest.raises(ArgumentError) as raised:  # a bare ValueError before, its grammar off ("for 1 channels")
        keras_cait.CaiT_XXS24(weights=None, input_shape=(224, 224, 1))
    assert str(raised.value) == ("input_shape=(224, 224, 1): has 1 channels, and include_preprocessing normalises RGB "
                                 "images with the ImageNet mean and std; for other images give "
                                 "include_preprocessing=False and normalise the inputs yourself")


def test_one_channel_is_fine_without_pretrained_weights_and_normalisation(offline, tiny_cait):
    model = tiny_cait(input_shape=(32, 32, 1), include_preprocessing=False)

    assert model.input_shape == (None, 32, 32, 1)


def test_imagenet_head_has_1000_classes(offline):
    with pytest.raises(ValueError, match=r"classes=10: the ImageNet head has 1000 classes.*"
                                         r"include_top=False.*weights=None"):
        keras_cait.CaiT_XXS24(weights="imagenet", classes=10)


@pytest.mark.parametrize("weights", ["imagenet21k", "IMAGENET", "model.bin", 3])
def test_unknown_weights_name_lists_the_valid_ones(offline, weights):
    with pytest.raises(ValueError) as error:
        keras_cait.CaiT_XXS24(weights=weights)

    message = str(error.value)
    assert f"weights={weights!r}" in message
    assert "give weights='imagenet', weights=None or the path of a .safetensors, .pth, .pt or .weights.h5 file" in message


def test_checkpoint_of_another_variant_names_the_keys(offline, tiny_checkpoint):
    with pytest.raises(ValueError) as error:
        keras_cait.CaiT_XXS24(weights=tiny_checkpoint)

    message = str(error.value)
    assert str(tiny_checkpoint) in message
    assert "'cait_xxs24' (24 blocks, width 192)" in message
    assert "missing keys: blocks.10." in message  # the tiny one has 2 blocks
    assert "keys whose shape does not fit: blocks.0.attn.proj.bias (64,)" in message
    assert "another CaiT variant" in message


def test_checkpoint_with_another_head_names_the_head_keys(offline, timm_reference, tiny_cait):
    path = timm_reference.save(timm_reference.tiny_model(num_classes=10))

    with pytest.raises(ValueError, match=r"does not fit: head\.bias \(10,\), head\.weight \(10, 64\)\."):
        load_weights_file(tiny_cait(classes=1000), path)


def test_variant_without_released_checkpoint_says_so(offline):
    with pytest.raises(ValueError) as error:
        keras_cait.CaiT_XS36(weights="imagenet")

    message = str(error.value)
    assert "CaiT_XS36 has no released ImageNet checkpoint" in message
    # The variants that have one, named as the registry's timm archs name them (cait_s24_224: S24).
    released = {arch.split("_")[1].upper() for arch in CHECKPOINTS}
    assert f"variants with one: {', '.join(v for v in keras_cait.VARIANTS if v in released)};" in message
    assert "weights=None" in message


def test_a_model_file_folder_or_other_file_given_as_weights_is_named_as_what_it_is(offline, tiny_cait, tmp_path):
    """Each was "unknown weights name", as if the path were a misspelt name."""
    model_file = str(tmp_path / "best.keras")
    tiny_cait().save(model_file)
    (tmp_path / "legacy.h5").write_bytes(b"")
    allowed = "give weights='imagenet', weights=None or the path of a .safetensors, .pth, .pt or .weights.h5 file"
    for weights, line in (
        (model_file, f"weights={model_file!r}: is a whole model (model.save), not weights; load it as a model: "
                     f"keras_cait.models.load_classifier({model_file!r}) or the command's --model; or save its "
                     "weights with model.save_weights('name.weights.h5') and give that"),
        (str(tmp_path), f"weights={str(tmp_path)!r}: is a folder; {allowed}"),
        (str(tmp_path / "legacy.h5"), f"weights={str(tmp_path / 'legacy.h5')!r}: is a file of a kind keras_cait "
                                      f"reads no weights from; {allowed}"),
    ):
        with pytest.raises(ArgumentError) as error:
            keras_cait.CaiT_XXS24(weights=weights)
        assert str(error.value) == line


def test_missing_weights_file_names_the_path(offline, tmp_path):
    path = str(tmp_path / "absent.safetensors")

    with pytest.raises(ValueError, match=f"weights={path!r}: no such file"):
        keras_cait.CaiT_XXS24(weights=path)


@pytest.mark.large
def test_imagenet_without_network_names_the_url_and_how_to_pass_a_local_file(keras_cache, monkeypatch):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv(HUB_URL_ENV, f"http://127.0.0.1:{port}")

    with pytest.raises(ConnectionError) as error:
        keras_cait.CaiT_XXS24(weights="imagenet")

    message = str(error.value)
    assert f"http://127.0.0.1:{port}/cait_xxs24_224.fb_dist_in1k/resolve/main/model.safetensors" in message
    assert "weights='/path/to/model.safetensors'" in message
    assert "XXS24_224.pth" in message
    assert not os.listdir(keras_cache)


def test_zero_channels_are_refused(offline):
    with pytest.raises(ValueError, match=r"input_shape=\(32, 32, 0\): the number of channels must "
                                         r"be a positive integer; e.g. \(32, 32, 3\)"):
        keras_cait.CaiT_XXS24(weights=None, input_shape=(32, 32, 0), include_preprocessing=False)


def test_weights_given_as_bytes_are_refused_with_the_fix(offline, tiny_checkpoint):
    with pytest.raises(ValueError, match=r"bytes of bytes, not a name or path; give weights='imagenet', .* write "
                                         r"it to a file and pass its path$"):
        keras_cait.CaiT_XXS24(weights=tiny_checkpoint.read_bytes(), input_shape=(32, 32, 3))


@pytest.mark.parametrize("arguments, message", [
    (dict(weights=None, input_shape=32), "input_shape=32: must be (height, width, channels), a tuple of ints, not int"),
    (dict(weights=None, input_shape="32"), "input_shape='32': must be (height, width, channels), a tuple of ints, not str"),
    (dict(weights="imagenet", classes="2"), "classes='2': must be a positive integer, the number of classes, not str"),
])
def test_a_constructor_names_an_argument_of_the_wrong_type_as_typed(arguments, message):
    """Before the ImageNet checks and `tuple(input_shape)`: as the user typed it, what it must be."""
    with pytest.raises(ArgumentError) as raised:
        keras_cait.CaiT_XXS24(**arguments)
    assert str(raised.value).startswith(message)
