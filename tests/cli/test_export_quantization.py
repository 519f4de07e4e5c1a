"""keras-cait export --quantization and OpenVINO outputs: what each format takes, refused before any work."""

import os

import pytest

from keras_cait.cli import main


@pytest.mark.parametrize(
    "output, quantization, message",
    [
        ("cait.tflite", "int8", "does not convert to LiteRT.*use --quantization dynamic_int8"),
        ("cait.xml", "int8", "OpenVINO export is float only"),
        ("cait.onnx", "dynamic_int8", r"must be one of \(None, 'int8'\), e.g. 'int8'"),
        ("serving/cait/1", "dynamic_int8", r"must be one of \(None, 'int8'\)"),
    ],
)
def test_unsupported_quantization_is_refused_before_the_model_is_built(output, quantization, message, tmp_path):
    # --weights imagenet would download the weights, if the check came after building the model.
    with pytest.raises(SystemExit, match=f"keras-cait export: --quantization {quantization}: .*{message}"):
        main(["export", str(tmp_path / output), "--quantization", quantization, "--model", "cait_s24_224"])
    assert os.listdir(tmp_path) == []


def test_top_k_is_refused_for_openvino(tmp_path):
    with pytest.raises(SystemExit, match="--top-k applies to SavedModels only"):
        main(["export", str(tmp_path / "cait.xml"), "--top-k", "3"])
