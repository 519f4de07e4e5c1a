"""Fixtures of the training tests."""

import pytest


@pytest.fixture(scope="module")
def folder(tmp_path_factory, digits):
    """100 digits, 10 per class, each image unique."""
    return digits(tmp_path_factory.mktemp("folder"), per_class=10)
