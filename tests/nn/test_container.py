"""Tests of frost/nn/container.py: Sequential, ModuleList, ModuleDict."""
from collections import OrderedDict

import numpy as np
import pytest
import torch

from frost import nn

from .helpers import compare_layer


def test_sequential_indexing_length_iteration_and_append():
    a, b, c = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
    seq = nn.Sequential(a, b)
    assert len(seq) == 2 and seq[0] is a and seq[-1] is b and list(seq) == [a, b]
    assert seq.append(c) is seq and seq[2] is c
    sub = seq[1:]
    assert isinstance(sub, nn.Sequential) and list(sub) == [b, c]
    with pytest.raises(IndexError, match="out of range"):
        seq[3]
    seq[1] = nn.Tanh()
    assert isinstance(seq[1], nn.Tanh)
    del seq[0]
    assert list(seq._modules) == ["0", "1"] and seq[1] is c
    seq.insert(0, a)
    assert list(seq) == [a, seq[1], c]


def test_sequential_from_ordered_dict_keeps_names():
    seq = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", nn.ReLU())]))
    assert [n for n, _ in seq.named_parameters()] == ["fc.weight", "fc.bias"]
    assert seq.fc is seq[0]


def test_sequential_forward_matches_torch():
    f = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))
    t = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    compare_layer(f, t, np.random.default_rng(0).standard_normal((5, 4)))


def test_sequential_repr_matches_torch():
    f = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1))
    t = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.1))
    assert repr(f) == repr(t)


def test_module_list_registers_and_indexes():
    layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(layers) == 3 and [n for n, _ in layers.named_parameters()][:2] == ["0.weight", "0.bias"]
    layers.append(nn.ReLU())
    layers.extend([nn.Tanh()])
    layers += [nn.Sigmoid()]
    assert len(layers) == 6 and isinstance(layers[-1], nn.Sigmoid)
    assert isinstance(layers[1:3], nn.ModuleList) and len(layers[1:3]) == 2
    del layers[0]
    assert list(layers._modules) == [str(i) for i in range(5)]
    layers.insert(1, nn.Identity())
    assert isinstance(layers[1], nn.Identity)
    with pytest.raises(IndexError):
        layers[10]
    with pytest.raises(TypeError, match="iterable"):
        layers.extend(3)


def test_module_list_repr_compresses_runs_like_torch():
    f = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 3)])
    t = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.ReLU(),
                             torch.nn.Linear(2, 3)])
    assert repr(f) == repr(t)
    assert repr(nn.ModuleList()) == repr(torch.nn.ModuleList())


def test_module_dict():
    d = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.ReLU()})
    assert list(d) == ["a", "b"] and "a" in d and len(d) == 2
    d["c"] = nn.Tanh()
    assert list(d.keys()) == ["a", "b", "c"]
    assert isinstance(d.pop("b"), nn.ReLU) and "b" not in d
    d.update([("e", nn.Identity())])
    assert [n for n, _ in d.named_parameters()] == ["a.weight", "a.bias"]
    assert repr(d) == repr(torch.nn.ModuleDict({"a": torch.nn.Linear(2, 2), "c": torch.nn.Tanh(),
                                                "e": torch.nn.Identity()}))
    with pytest.raises(ValueError, match="length 3"):
        d.update([("x", nn.ReLU(), 1)])
    d.clear()
    assert len(d) == 0


def test_a_refused_insert_leaves_the_container_as_it_was():
    for container in (nn.Sequential(nn.ReLU(), nn.Tanh()), nn.ModuleList([nn.ReLU(), nn.Tanh()])):
        with pytest.raises(TypeError, match="insert: str is not a Module subclass"):
            container.insert(1, "x")
        assert [type(m).__name__ for m in container] == ["ReLU", "Tanh"]
