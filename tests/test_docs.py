"""The examples in the docstrings of the torch-free layers run and print what they show."""

import doctest
import importlib

import pytest

from test_torch_free import torch_free_modules


@pytest.mark.parametrize("name", torch_free_modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
