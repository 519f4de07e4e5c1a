"""keras_cait.images.decoder_messages: libjpeg's own lines kept off standard error, everything else kept."""

import os
import subprocess
import sys

import pytest

from keras_cait.images.decoder_messages import decoder_message, decoder_messages_dropped

LIBJPEG = [b"Input file read error", b"Improper call to JPEG library in state 203",
           b"Corrupt JPEG data: 2 extraneous bytes before marker 0xd9", b"Premature end of JPEG file"]
RECORDS = [b"E0000 00:00:1795740381.621177   30956 jpeg_mem.cc:331] Premature end of JPEG data. Stopped at line 14/64",
           b"W0000 00:00:1795740399.061698   30975 local_rendezvous.cc:412] Local rendezvous is aborting with "
           b"status: INVALID_ARGUMENT: Invalid JPEG data, size 4"]
KEPT = [b"UserWarning: keep me", b"W0000 00:00:1795740399.061698   30975 local_rendezvous.cc:412] Local rendezvous "
        b"is aborting with status: OUT_OF_RANGE: End of sequence", b"Traceback (most recent call last):"]


def test_the_decoders_lines_are_told_from_the_others():
    assert all(decoder_message(line) for line in LIBJPEG + RECORDS)
    assert not any(decoder_message(line) for line in KEPT)


# Run in a fresh process from the module's file (no TensorFlow to import): pytest's capture hands
# Python's sys.stderr a file of its own, which would not go through file descriptor 2.
CHILD = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("decoder_messages", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print("before", file=sys.stderr, flush=True)
with module.decoder_messages_dropped():
    os.write(2, b"first\\n" + LIBJPEG + b"\\n")
    print("from Python", file=sys.stderr, flush=True)
    os.write(2, RECORD + b"\\n\\t [[{{function_node cond_true_1056}}{{node cond/DecodeJpeg}}]]\\nlast")
print("after", file=sys.stderr)
"""


@pytest.mark.large
def test_only_the_decoders_lines_are_dropped_the_others_pass_in_order():
    code = CHILD.replace("LIBJPEG", repr(b"\n".join(LIBJPEG))).replace("RECORD", repr(RECORDS[1]))
    module = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "keras_cait", "images",
                          "decoder_messages.py")
    done = subprocess.run([sys.executable, "-c", code, module], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b"before\nfirst\nfrom Python\nlastafter\n"


LOAD_DAMAGED = """
import io, sys
import numpy as np
from PIL import Image
import keras_cait
image = io.BytesIO()
Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(image, "JPEG")
with open(sys.argv[1], "wb") as file:
    file.write(image.getvalue()[:len(image.getvalue()) // 2])
try:
    keras_cait.preprocessing.load_image(sys.argv[1], 32)
except ValueError as error:
    print(error)
"""


@pytest.mark.large
def test_load_image_of_a_damaged_file_says_one_line_and_the_decoders_none(tmp_path):
    """From a notebook whose TensorFlow logs at its default level: the ValueError names the file,
    and libjpeg's and TensorFlow's own lines about it ("Premature end of JPEG data", "Local
    rendezvous is aborting") do not reach standard error above it."""
    env = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    path = tmp_path / "cut.jpg"
    done = subprocess.run([sys.executable, "-c", LOAD_DAMAGED, str(path)], capture_output=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().startswith(f"Cannot read image {str(path)!r}"), done.stdout.decode()
    assert "invalid JPEG data (a truncated or damaged file)" in done.stdout.decode()
    assert not any(decoder_message(line) for line in done.stderr.splitlines()), done.stderr.decode()
    assert b"JPEG" not in done.stderr, done.stderr.decode()
