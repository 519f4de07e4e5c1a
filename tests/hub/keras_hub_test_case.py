"""keras-hub's own `TestCase`, imported from the installed keras-hub (its wheel ships it).

keras-hub's test_case.py imports `grain` at its top, for its Grain preprocessing checks
(`run_grain_preprocessing_test`), which no CaiT test calls. grain is keras-hub's optional
[grain] extra, which keras-cait[test] does not install. Where it is missing, a module that
raises on first use stands for it: the import succeeds, and any check that did use grain
would fail naming the missing package, never pass or skip.
"""

import sys
import types


class _Missing(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):  # what inspect and pickle look up on any module
            raise AttributeError(name)
        raise ImportError(
            f"grain.{name}: grain is not installed; keras-hub's Grain checks need it: pip install grain"
        )


try:
    import grain  # noqa: F401
except ImportError:
    sys.modules["grain"] = _Missing("grain")

from keras_hub.src.tests import test_case  # noqa: E402


class TestCase(test_case.TestCase):
    """keras-hub's `TestCase` as it is, less one name that pytest would collect and skip."""

    # tf.test.TestCase's `test_session` is a TF1 session context manager, not a test.
    test_session = None
