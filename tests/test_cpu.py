"""keras_cait.cpu: the CPU's feature flags, read as Linux states them, none where they cannot be read."""

import builtins
import io
import platform

import pytest

from keras_cait import cpu

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16
bugs\t\t: sysret_ss_attrs
flags_extra\t: -

processor\t: 1
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16
"""


def test_the_flags_are_the_flags_lines_words(monkeypatch):
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *args, **kwargs: io.StringIO(CPUINFO)
                        if path == "/proc/cpuinfo" else real_open(path, *args, **kwargs))
    assert cpu.cpu_flags() == {"fpu", "sse2", "avx2", "avx512f", "avx512_bf16"}  # not flags_extra's


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x86 flags of the machines the suite runs on")
def test_this_machine_s_flags_are_read():
    flags = cpu.cpu_flags()
    assert {"fpu", "sse2"} <= flags and all(flag and not any(c.isspace() for c in flag) for flag in flags)


def test_no_flags_where_they_cannot_be_read(monkeypatch):
    def unreadable(path, *args, **kwargs):
        raise PermissionError(path)

    monkeypatch.setattr(builtins, "open", unreadable)
    assert cpu.cpu_flags() == set()
