"""keras_cait.variants: the variant table and the CaiT_* constructors."""

import numpy as np
import pytest

import keras_cait
from keras_cait import variants

# The variants of the paper that timm does not define: the LayerScale init of the released models
# beside them (M24 as S24, XS36 as XXS36, S48 as S36 and M48).
NOT_IN_TIMM = {"M24": 1e-5, "XS36": 1e-5, "S48": 1e-6}


def reference_init(variant):
    """The LayerScale init of timm's factories of `variant` (e.g. cait_s36_384), read from the
    gammas of a one-block model that the factory builds with its own init_values."""
    import timm

    archs = timm.list_models(f"cait_{variant.lower()}_*")
    if not archs:
        return NOT_IN_TIMM[variant]
    inits = set()
    for arch in archs:
        model = timm.create_model(arch, depth=1, embed_dim=16, num_heads=2, img_size=32, num_classes=2)
        gammas = [p for name, p in model.named_parameters() if name.rsplit(".", 1)[-1].startswith("gamma_")]
        inits |= {float(value) for gamma in gammas for value in gamma.detach().numpy()}
    assert len(inits) == 1, f"{archs}: LayerScale inits {inits}"
    return inits.pop()


@pytest.mark.parametrize("variant", variants.VARIANTS)
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
