"""export_openvino's graph as OpenVINO's CPU plugin compiles it: the talking-heads mixes run in the
inference precision asked for, like every other matmul (bf16 where the CPU has bfloat16 units)."""

import numpy as np
import pytest

from keras_cait.export import export_openvino
from keras_cait.export import openvino as exporter
from keras_cait.models.architecture import build_cait

openvino = pytest.importorskip("openvino")  # the [openvino] extra, which the test extra installs


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = build_cait(embed_dim=32, depth=2, num_heads=4, init_values=0.1, patch_size=8, input_shape=(32, 32, 3),
                       classes=5)
    path = tmp_path_factory.mktemp("openvino") / "cait.xml"
    export_openvino(model, path)
    return model, openvino.Core().read_model(str(path))


def runtime_precisions(graph, names, hint):
    """{friendly name: the precision OpenVINO's CPU plugin runs it in} of the ops `names` under `hint`."""
    compiled = openvino.Core().compile_model(graph, "CPU", {"INFERENCE_PRECISION_HINT": hint})
    precisions = {}
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        for name in set(info["originalLayersNames"].astype(str).split(",")) & set(names):
            precisions[name] = info["runtimePrecision"].astype(str)
    return precisions


def test_the_talking_heads_mixes_run_in_the_inference_precision(exported):
    """A MatMul whose left operand is a constant ran in f32 under the bf16 hint, with reorders from and
    back to bf16 around it: a fifth of S24's time at batch 16 (docs/benchmarks.md)."""
    model, graph = exported
    mixes = exporter.matmul_roles(graph)["head_mixes"]
    assert len(mixes) == 2 * 2  # two per self-attention block
    for op in graph.get_ops():
        if op.get_friendly_name() in mixes:
            assert op.input_value(0).get_node().get_type_name() != "Constant"
    assert runtime_precisions(graph, mixes, "f32") == dict.fromkeys(mixes, "f32")
    bfloat16 = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    # Where the CPU has no bfloat16 units OpenVINO computes everything in f32 under either hint.
    assert runtime_precisions(graph, mixes, "bf16") == dict.fromkeys(mixes, "bf16" if bfloat16 else "f32")
    images = np.random.default_rng(0).uniform(0, 255, (3, 32, 32, 3)).astype("float32")
    compiled = openvino.Core().compile_model(graph, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    np.testing.assert_allclose(compiled(images)[0], model.predict(images, verbose=0), rtol=1e-4, atol=1e-5)
