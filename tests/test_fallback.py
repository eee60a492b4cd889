"""A graph remat cannot plan falls back to PyTorch's partitioner with a warning; strict raises."""

import pytest
import torch

import remat
from remat.lower.partitioner import RematFallbackWarning


def with_cond(x):
    return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,)) * 2


def test_unplannable_graph_falls_back_with_warning_and_right_gradients():
    torch.manual_seed(0)
    x = torch.randn(64, requires_grad=True)
    with pytest.warns(RematFallbackWarning, match="higher-order op 'cond'"):
        out = remat.compile(with_cond, compiler="eager")(x)
    out.sum().backward()
    ref = torch.autograd.grad(with_cond(x).sum(), x)[0]
    torch.testing.assert_close(x.grad, ref)


def test_strict_mode_names_the_node_and_reason():
    x = torch.randn(64, requires_grad=True)
    with pytest.raises(Exception, match="node 'cond' calls the higher-order op 'cond'") as info:
        remat.compile(with_cond, compiler="eager", strict=True)(x)
    assert "UnsupportedGraphError" in str(info.value) or isinstance(info.value, remat.UnsupportedGraphError)
