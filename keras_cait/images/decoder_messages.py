"""The image decoders' own messages kept off the terminal while images are decoded.

libjpeg prints its warnings and errors ("Input file read error", "Improper call to JPEG library
in state 203", "Corrupt JPEG data: ...") on standard error with `fprintf`, below TensorFlow's
logging, so `TF_CPP_MIN_LOG_LEVEL` does not hide them; TensorFlow adds a record of its own
("jpeg_mem.cc:331] Premature end of JPEG data") and, when a tf.data pipeline stops on a decode
error, "Local rendezvous is aborting with status: INVALID_ARGUMENT: ...". Each bad file is
named by keras_cait in its own words, so these lines are noise above that line.

`decoder_messages_dropped()` runs its body with standard error (file descriptor 2) flowing
through a pipe; a thread writes every line on to the real standard error, in order, except
those. Everything else (Python's warnings and tracebacks, TensorFlow's other records) passes.
"""

import os
import re

from keras_cait.io.stderr import stderr_through, write_all

# libjpeg-turbo's messages (jerror.h) that decompression can print.
_LIBJPEG = re.compile(
    rb"(Corrupt JPEG data|Premature end of JPEG file|Invalid JPEG file structure|Improper call to JPEG "
    rb"library|Input file read error|Not a JPEG file|Unsupported marker type|Bogus (marker length|DQT "
    rb"index|Huffman table|input colorspace|sampling factors|virtual array)|Huffman table 0x|Quantization "
    rb"table 0x|Unsupported JPEG process|Invalid SOS parameters|Inconsistent progression sequence|Unknown "
    rb"Adobe color transform|Application transferred too many scanlines|Warning: unknown JFIF revision|"
    rb"Maximum supported image dimension|Empty JPEG image|Sampling factors too large|JPEG datastream "
    rb"contains no image|Unsupported color conversion|Invalid component ID|Premature end of input file)"
)
# An Abseil record of TensorFlow's ("E0000 00:00:1795740381.621177   30956 jpeg_mem.cc:331] ...").
_RECORD = re.compile(rb"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ ([\w.]+):\d+\] (.*)")
_DECODER_SOURCES = {b"jpeg_mem.cc", b"jpeg_handle.cc", b"png_io.cc", b"gif_io.cc", b"decode_image_op.cc"}
_DECODE_ERROR = re.compile(rb"JPEG|PNG|GIF|BMP|WebP|[Ii]mage|pixels; at most")


def decoder_message(line):
    """Whether `line` (bytes, without its newline) is a decoder's message (see the module)."""
    if _LIBJPEG.match(line):
        return True
    record = _RECORD.match(line)
    if record is None:
        return False
    source, text = record.groups()
    return source in _DECODER_SOURCES or (
        source == b"local_rendezvous.cc" and b"INVALID_ARGUMENT" in text and bool(_DECODE_ERROR.search(text)))


def decoder_messages_dropped():
    """Runs its body with the decoders' messages removed from standard error (the module)."""
    return stderr_through(_forward, "keras_cait-decoder-messages")


def _forward(read_end, original):
    pending, continuation = b"", False
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(1 << 16):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = []
            for line in lines:
                # A dropped record's own continuation lines ("\t [[{{node DecodeJpeg}}]]") go with it.
                continuation = (continuation and line[:1] in (b"\t", b" ")) or decoder_message(line)
                if not continuation:
                    kept.append(line + b"\n")
            write_all(original, b"".join(kept))
    if pending and not decoder_message(pending):
        write_all(original, pending)
