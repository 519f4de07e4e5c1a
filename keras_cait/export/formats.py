"""The export formats as one table, a row per format.

Every place that depends on the format reads `FORMATS`: `check_destination` and
`check_quantization` (keras_cait/export/core.py), the exporters found as
`keras_cait.export.<exporter>` and `keras_cait.<exporter>`, and `keras-cait export`
(its dispatch, `--quantization` choices and help). docs/export.md's formats table is
`markdown_table()`; tests/export/test_formats.py holds the two equal.

Adding a format is one module, `keras_cait/export/<name>.py` defining `export_<name>`,
and one row below.

This module imports nothing heavy: the command line reads it to build its parser on
any backend, before TensorFlow is loaded.
"""

import dataclasses
import importlib
import os


@dataclasses.dataclass(frozen=True)
class Format:
    """One export format: where it writes, which exporter writes it, what it takes."""

    name: str  # what users call it, e.g. "ONNX"
    suffix: str | None  # how the destination ends, e.g. ".onnx"; None: a TF Serving version folder
    exporter: str  # "export_<module>": defined in keras_cait/export/<module>.py
    quantizations: tuple  # the `quantization=` values it takes, None (float) first
    extra: str | None  # to export: pip install "keras-cait[<extra>]"; None: keras-cait alone
    refusal: str  # why any other `quantization` is refused and what to do, after "quantization=<mode>: "
    refusals: dict = dataclasses.field(default_factory=dict, hash=False)  # {mode: its own refusal}
    writes: str = ""  # for docs/export.md: what the destination holds
    runs_on: str = ""  # for docs/export.md: what serves it

    def __post_init__(self):
        if not self.exporter.startswith("export_"):
            raise ValueError(f"exporter {self.exporter!r}: must be export_<module>")

    @property
    def module(self):
        """`keras_cait.export.<module>`, the module that defines the exporter."""
        return "keras_cait.export." + self.exporter.removeprefix("export_")

    def load(self):
        """The exporter function, its module imported (TensorFlow with it)."""
        return getattr(importlib.import_module(self.module), self.exporter)

    def refused(self, quantization):
        """The line refusing `quantization`, or None where this format takes it."""
        if quantization in self.quantizations:
            return None
        own = self.refusals.get(quantization) if isinstance(quantization, str) else None
        return f"quantization={quantization!r}: {own or self.refusal}"


FORMATS = (
    Format(
        name="SavedModel",
        suffix=None,
        exporter="export_saved_model",
        quantizations=(None, "int8", "int4", "float8"),
        extra=None,
        refusal="must be one of (None, 'int8'), e.g. 'int8', or Keras' smaller 'int4' or 'float8'.",
        writes="a SavedModel version folder, e.g. `serving/cait/1`",
        runs_on="TF Serving (REST and gRPC), `tf.saved_model.load`",
    ),
    Format(
        name="ONNX",
        suffix=".onnx",
        exporter="export_onnx",
        quantizations=(None, "int8"),
        extra="onnx",
        refusal="must be one of (None, 'int8'), e.g. 'int8', for ONNX (tf2onnx unpacks int4 kernels to "
                "float32, no smaller than float, and has no float8); export a SavedModel for 'int4' or 'float8'.",
        writes="an ONNX file",
        runs_on="onnxruntime and other ONNX runtimes",
    ),
    Format(
        name="LiteRT",
        suffix=".tflite",
        exporter="export_litert",
        quantizations=(None, "dynamic_int8"),
        extra=None,
        refusal="must be one of (None, 'dynamic_int8'), e.g. 'dynamic_int8'.",
        refusals={
            "int8": "Keras' int8 model does not convert to LiteRT (TFLite's fully_connected takes no int8 "
                    "activations); use quantization='dynamic_int8', TFLite's own int8 weights.",
        },
        writes="a LiteRT (TFLite) flatbuffer",
        runs_on='the LiteRT interpreter (`ai-edge-litert`, `pip install "keras-cait[litert]"`), Android, iOS, '
                "microcontrollers",
    ),
    Format(
        name="OpenVINO",
        suffix=".xml",
        exporter="export_openvino",
        quantizations=(None,),
        extra="openvino",
        refusal="the OpenVINO export is float only, since Keras' int8 model does not convert to OpenVINO "
                "correctly; export the float model and compress it with OpenVINO's NNCF "
                "(nncf.compress_weights), or use int8 with a SavedModel or ONNX.",
        writes="OpenVINO IR: the `.xml` graph and its `.bin` weights beside it",
        runs_on="OpenVINO (Intel's CPU/GPU/NPU runtime)",
    ),
)

EXPORTERS = tuple(row.exporter for row in FORMATS)

# What each `quantization` mode is, for `keras-cait export --help`; docs/export.md tells more.
QUANTIZATION_MODES = {
    "int8": "Keras int8",
    "int4": "Keras int4",
    "float8": "Keras float8",
    "dynamic_int8": "TFLite int8 weights",
}


def format_of(path):
    """The row of the format that `path` names: by its suffix, else the version folder's."""
    path = os.fspath(path)
    for row in file_formats():
        if path.endswith(row.suffix):
            return row
    return folder_format()


def folder_format():
    """The row of the format written as a folder (no suffix): the SavedModel's."""
    return next(row for row in FORMATS if row.suffix is None)


def file_formats():
    """The rows of the formats written as files, in the table's order."""
    return [row for row in FORMATS if row.suffix is not None]


def by_exporter(exporter):
    """The row whose exporter is `exporter` ("export_onnx")."""
    return next(row for row in FORMATS if row.exporter == exporter)


def quantization_modes():
    """Every mode that some format takes, in the table's order, None left out."""
    return list(dict.fromkeys(mode for row in FORMATS for mode in row.quantizations if mode is not None))


# The modes of the SavedModel, LiteRT and ONNX exports, under the names keras_cait.export has exported.
KERAS_QUANTIZATIONS = by_exporter("export_saved_model").quantizations
QUANTIZATIONS = by_exporter("export_litert").quantizations
ONNX_QUANTIZATIONS = by_exporter("export_onnx").quantizations


def markdown_table():
    """docs/export.md's formats table, between its `export_formats` markers."""
    lines = [
        "| format | destination | exporter | `quantization` | to install | writes | runs on "
        "| any other mode is refused with `quantization=<mode>: …` |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in FORMATS:
        destination = f"`*{row.suffix}`" if row.suffix else "any other path: `MODEL_BASE_PATH/<n>`"
        modes = ", ".join("None" if mode is None else f'`"{mode}"`' for mode in row.quantizations)
        install = f'`pip install "keras-cait[{row.extra}]"`' if row.extra else "nothing more"
        refusals = " ".join(f"`{mode}`: {text}" for mode, text in row.refusals.items())
        refusal = f"{refusals} Any other: {row.refusal}" if refusals else row.refusal
        lines.append(
            f"| {row.name} | {destination} | `{row.exporter}` | {modes} | {install} | {row.writes} | "
            f"{row.runs_on} | {refusal} |"
        )
    return "\n".join(lines)
