"""The export formats as one table, a row per format.

Every place that depends on the format reads `FORMATS`: `check_destination` and
`check_quantization` (keras_cait/export/core.py), the exporters found as
`keras_cait.export.<exporter>` and `keras_cait.<exporter>`, and `keras-cait export`
(its dispatch, `--quantization` and `--compute-dtype` choices, help and refusals). A
refusal is written from the table too: what each format takes, and where the refused
value goes (`Format.refused`, `Format.refused_compute_dtype`), and calibration images missing
where a mode needs them or given where it takes none (`Format.refused_calibration`).
docs/export.md's formats table is `markdown_table()`; tests/export/test_formats.py holds the two equal.

Adding a format is one module, `keras_cait/export/<name>.py` defining `export_<name>`,
and one row below.

This module imports nothing heavy: the command line reads it to build its parser on
any backend, before TensorFlow is loaded.
"""

import dataclasses
import importlib
import os

from keras_cait.errors import ArgumentError, Named


@dataclasses.dataclass(frozen=True)
class Format:
    """One export format: where it writes, which exporter writes it, what it takes."""

    name: str  # what users call it, e.g. "ONNX"
    suffix: str | None  # how the destination ends, e.g. ".onnx"; None: a TF Serving version folder
    exporter: str  # "export_<module>": defined in keras_cait/export/<module>.py
    quantizations: tuple  # the `quantization=` values it takes, None (float) first
    extra: str | None  # to export: pip install "keras-cait[<extra>]"; None: keras-cait alone
    refusal: str | None = None  # why it takes no other `quantization` (a sentence), where there is more to say
    refusals: dict = dataclasses.field(default_factory=dict, hash=False)  # {mode: why that mode is refused}
    compute_dtypes: tuple = ("float32",)  # the `compute_dtype=` values it takes, float32 first
    calibrated: tuple = ()  # the modes that need `calibration=` images (NNCF's int8)
    # {mode: what it is in this format}, where that is not QUANTIZATION_MODES' description
    modes: dict = dataclasses.field(default_factory=dict, hash=False)
    writes: str = ""  # for docs/export.md: what the destination holds
    runs_on: str = ""  # for docs/export.md: what serves it
    # Why it takes no model that `model.quantize` quantised already; empty where it exports one as it is.
    quantized_model: str = ""
    companions: tuple = ()  # the suffixes of the files written beside the destination (OpenVINO's ".bin")

    def __post_init__(self):
        if not self.exporter.startswith("export_"):
            raise ValueError(f"exporter {self.exporter!r}: must be export_<module>")

    def companion_paths(self, path):
        """The files written beside the file at `path`: `cait.xml` -> `["cait.bin"]`."""
        return [os.fspath(path).removesuffix(self.suffix) + suffix for suffix in self.companions]

    @property
    def module(self):
        """`keras_cait.export.<module>`, the module that defines the exporter."""
        return "keras_cait.export." + self.exporter.removeprefix("export_")

    def load(self):
        """The exporter function, its module imported (TensorFlow with it)."""
        return getattr(importlib.import_module(self.module), self.exporter)

    @property
    def destination(self):
        """"a SavedModel version folder", "a .onnx file": what a path of this format is."""
        return f"a {self.suffix} file" if self.suffix else f"a {self.name} version folder"

    @property
    def example(self):
        return f"cait{self.suffix}" if self.suffix else "serving/cait/1"

    def refused(self, quantization):
        """The `ArgumentError` refusing `quantization`, or None where this format takes it:

            quantization='dynamic_int8': SavedModel (a version folder) takes int8, int4 or float8;
            ONNX (a .onnx file) int8; ... For dynamic_int8, export to a .tflite file, e.g. cait.tflite.
        """
        if quantization in self.quantizations:
            return None
        own = self.refusals.get(quantization) if isinstance(quantization, str) else None
        return self._refusal("quantization", quantization, own or self.refusal)

    def describe(self, mode):
        """What `quantization=mode` is in this format: "Keras int8", "NNCF int8, calibrated"."""
        return self.modes.get(mode, QUANTIZATION_MODES[mode])

    def refused_calibration(self, quantization, calibration):
        """The `ArgumentError` refusing calibration images missing where `quantization` needs them
        (NNCF's int8) or given where it takes none; None where they fit:

            quantization='int8': OpenVINO (a .xml file) calibrates int8 on images like those the model
            will classify; give calibration=FOLDER (...), or quantization='int8_weights', which needs none
        """
        needed = quantization in self.calibrated
        if needed and calibration is None:
            free = [mode for mode in self.quantizations if mode and mode not in self.calibrated]
            return ArgumentError(
                "quantization", quantization,
                f"{self._label} calibrates {quantization} on images like those the model will classify",
                ["give ", Named("calibration", shown="FOLDER"), " (a few hundred of them, e.g. its validation "
                 "folder)", *([", or ", Named("quantization", free[0]), ", which needs none"] if free else [])],
                usage=True)
        if needed or calibration is None:
            return None
        takers = [[f"{row.name} ({row.destination}) with ", Named("quantization", mode)]
                  for row in FORMATS for mode in row.calibrated]
        joined = [part for index, taker in enumerate(takers) for part in ([" or "] if index else []) + taker]
        folder = isinstance(calibration, (str, os.PathLike))
        return ArgumentError(
            "calibration", os.fspath(calibration) if folder else None,
            [Named("quantization", quantization), f" to {self._label} takes no calibration images; only ", *joined,
             " does"],
            "leave it out, or export that", usage=True, shown=None if folder else "<images>")

    def refused_compute_dtype(self, compute_dtype):
        """The `ArgumentError` refusing `compute_dtype` ("bfloat16" to a .onnx file), or None where this format
        takes it."""
        if compute_dtype in self.compute_dtypes:
            return None
        return self._refusal("compute_dtype", compute_dtype)

    def _refusal(self, argument, value, why=None):
        """`argument=value: <what each format takes, this one first>. <why> <where value goes>`."""
        attribute = {"quantization": "quantizations", "compute_dtype": "compute_dtypes"}[argument]
        verb = "takes" if argument == "quantization" else "computes in"

        def takes(row):
            values = [each for each in getattr(row, attribute) if each is not None]
            return listed(values, "or") if values else "float only"

        others = [row for row in FORMATS if row is not self]
        listing = "; ".join([f"{self._label} {verb} {takes(self)}", *(f"{row._label} {takes(row)}" for row in others)])
        takers = [row for row in FORMATS if value in getattr(row, attribute)]
        if takers:
            where = (f"For {value}, export to {listed([row.destination for row in takers], 'or')}, e.g. "
                     f"{listed([row.example for row in takers], 'or')}.")
        else:
            where = f"No format takes {value}; give one of those, or leave {argument} out."
        text = " ".join(filter(None, [f"{listing}.", f"{why}." if why else None, where]))
        return ArgumentError(argument, value, text, usage=True)

    @property
    def _label(self):
        """"SavedModel (a version folder)", "ONNX (a .onnx file)"."""
        return f"{self.name} ({self.destination.replace(f' {self.name} ', ' ')})"


FORMATS = (
    Format(
        name="SavedModel",
        suffix=None,
        exporter="export_saved_model",
        quantizations=(None, "int8", "int4", "float8"),
        extra=None,
        compute_dtypes=("float32", "bfloat16"),
        writes="a SavedModel version folder, e.g. `serving/cait/1`",
        runs_on="TF Serving (REST and gRPC), `tf.saved_model.load`",
    ),
    Format(
        name="ONNX",
        suffix=".onnx",
        exporter="export_onnx",
        quantizations=(None, "int8"),
        extra="onnx",
        refusals={
            "int4": "tf2onnx unpacks int4 kernels to float32, no smaller than float",
            "float8": "tf2onnx has no float8",
        },
        writes="an ONNX file",
        runs_on="onnxruntime and other ONNX runtimes",
    ),
    Format(
        name="LiteRT",
        suffix=".tflite",
        exporter="export_litert",
        quantizations=(None, "dynamic_int8"),
        extra=None,
        refusals={
            "int8": "Keras' int8 model does not convert to LiteRT (TFLite's fully_connected takes no int8 "
                    "activations); dynamic_int8 is TFLite's own int8 weights",
        },
        quantized_model="TFLite's converter fails on Keras' quantised layers",
        writes="a LiteRT (TFLite) flatbuffer",
        runs_on='the LiteRT interpreter (`ai-edge-litert`, `pip install "keras-cait[litert]"`), Android, iOS, '
                "microcontrollers",
    ),
    Format(
        name="OpenVINO",
        suffix=".xml",
        exporter="export_openvino",
        quantizations=(None, "int8", "int8_weights"),
        extra="openvino",
        refusal="OpenVINO's int8 is NNCF's (int8 calibrated, int8_weights data-free); Keras' int4 and float8 "
                "models do not convert to OpenVINO correctly",
        calibrated=("int8",),
        modes={"int8": "NNCF int8 weights and activations, calibrated"},
        quantized_model="OpenVINO's converter computes Keras' quantised layers wrongly",
        writes="OpenVINO IR: the `.xml` graph and its `.bin` weights beside it",
        companions=(".bin",),
        runs_on="OpenVINO (Intel's CPU/GPU/NPU runtime)",
    ),
)

EXPORTERS = tuple(row.exporter for row in FORMATS)
# The images NNCF's int8 calibrates on by default (`calibration_size`): NNCF's own default
# (`nncf.quantize`'s subset_size). CaiT-XXS24 calibrated on 300 photos in 190 s on 2 cores that
# other jobs shared (load average 8); docs/export.md.
CALIBRATION_SIZE = 300

# What each `quantization` mode is, for `keras-cait export --help`; docs/export.md tells more.
QUANTIZATION_MODES = {
    "int8": "Keras int8",
    "int4": "Keras int4",
    "float8": "Keras float8",
    "dynamic_int8": "TFLite int8 weights",
    "int8_weights": "NNCF int8 weights, no calibration",
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


def compute_dtypes():
    """Every `compute_dtype` that some format takes, float32 first."""
    return list(dict.fromkeys(dtype for row in FORMATS for dtype in row.compute_dtypes))


def listed(names, last="and"):
    """["A", "B", "C"] -> "A, B and C"."""
    names = list(names)
    return f" {last} ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


# The modes of the SavedModel, LiteRT and ONNX exports, under the names keras_cait.export has exported.
KERAS_QUANTIZATIONS = by_exporter("export_saved_model").quantizations
QUANTIZATIONS = by_exporter("export_litert").quantizations
ONNX_QUANTIZATIONS = by_exporter("export_onnx").quantizations


def markdown_table():
    """docs/export.md's formats table, between its `export_formats` markers."""
    lines = [
        "| format | destination | exporter | `quantization` | `compute_dtype` | to install | writes | runs on "
        "| why it takes no other mode |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in FORMATS:
        destination = f"`*{row.suffix}`" if row.suffix else "any other path: `MODEL_BASE_PATH/<n>`"
        modes = ", ".join("None" if mode is None else f'`"{mode}"`' for mode in row.quantizations)
        dtypes = ", ".join(f'`"{dtype}"`' for dtype in row.compute_dtypes)
        install = f'`pip install "keras-cait[{row.extra}]"`' if row.extra else "nothing more"
        whys = [f"`{mode}`: {text}." for mode, text in row.refusals.items()]
        whys += [f"{'Any other: ' if whys else ''}{row.refusal}."] if row.refusal else []
        lines.append(
            f"| {row.name} | {destination} | `{row.exporter}` | {modes} | {dtypes} | {install} | {row.writes} | "
            f"{row.runs_on} | {' '.join(whys) or '—'} |"
        )
    return "\n".join(lines)
