"""keras_cait.models.variants: the variant table, the CaiT_* constructors made from it, and its copies in the docs.

Every test here runs over `VARIANTS`, so a new row is tested as the others are. Whether a row's
numbers are the reference's is checked here; whether keras_cait computes what timm computes for
the row is tests/test_parity.py's `test_every_variant_matches_timm_s_cait_built_from_its_row`.
"""

import functools
import inspect
import pathlib
import pickle
import pydoc
import re

import numpy as np
import pytest

import keras_cait
from keras_cait.models import variants
from keras_cait.models.variants import VARIANTS
from keras_cait.weights import CHECKPOINTS

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
