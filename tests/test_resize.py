"""The resize engine: validation first, transactional application, L1 selection."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import fxsym


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 6, 1), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 5),
                         nn.ReLU(), nn.Linear(5, 2)).eval()


X = (torch.randn(2, 3, 4, 4),)
Snapshot = tuple[dict[str, torch.Tensor], dict[str, object]]


def _snapshot(model: nn.Module) -> Snapshot:
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attrs = {name: {k: copy.copy(v) for k, v in vars(m).items()
                    if k not in ("_parameters", "_buffers", "_modules")}
             for name, m in model.named_modules()}
    return state, attrs


def _assert_unchanged(model: nn.Module, snap: Snapshot) -> None:
    state, attrs = snap
    now = model.state_dict()
    assert now.keys() == state.keys()
    for k, v in state.items():
        assert now[k].shape == v.shape and torch.equal(now[k], v), k
    for name, m in model.named_modules():
        current = {k: v for k, v in vars(m).items()
                   if k not in ("_parameters", "_buffers", "_modules")}
        assert current.keys() == attrs[name].keys()  # type: ignore[union-attr]


@pytest.mark.parametrize("choices, match", [
    ({"nope.out_channels": 2}, r"unknown group 'nope.out_channels'; did you mean .*0.out_channels"),
    ({"0.out_channels": [0, 8]}, r"in \[0, 8\)"),
    ({"0.out_channels": [-1, 2]}, r"in \[0, 8\)"),
    ({"0.out_channels": [1, 1, 2]}, "duplicate"),
    ({"0.out_channels": []}, "cannot keep 0"),
    ({"0.out_channels": 0}, "between 1 and 8"),
    ({"0.out_channels": 9}, "between 1 and 8"),
    ({"0.out_channels": [0.5, 1.0]}, "integers"),
    ({"0.out_channels": True}, "size or indices"),
    ({"0.out_channels": [[0, 1]]}, "1-D"),
    ({"0.out_channels": [1, 2], "3.out_channels": [7]}, r"in \[0, 6\)"),  # second one bad
    # not a group, but a size the analysis knows: why it cannot be resized alone
    ({"8.out_features": 1}, r"'8.out_features' is constant: reaches the model output"),
    ({"6.in_features": 3}, r"'6.in_features' is a member of group '3.out_channels'"),
    ({"1.num_features": 3}, r"'1.num_features' is a member of group '0.out_channels'"),
])
def test_bad_choices_raise_and_leave_model_bit_identical(choices, match) -> None:
    model = _model()
    sm = fxsym.analyze(model, example_inputs=X)
    snap = _snapshot(model)
    with pytest.raises(fxsym.ResizeError, match=match):
        fxsym.resize(model, sm, choices)
    _assert_unchanged(model, snap)


def test_indices_are_kept_in_order_everywhere() -> None:
    model = _model()
    ref = copy.deepcopy(model)
    sm = fxsym.analyze(model, example_inputs=X)
    keep = [5, 0, 3]
    fxsym.resize(model, sm, {"0.out_channels": keep})
    idx = torch.tensor(keep)
    assert torch.equal(model[0].weight, ref[0].weight[idx])
    assert torch.equal(model[1].running_mean, ref[1].running_mean[idx])
    assert torch.equal(model[3].weight, ref[3].weight[:, idx])
    assert model[0].out_channels == model[1].num_features == model[3].in_channels == 3
    assert model(*X).shape == (2, 2)


def test_flatten_block_expansion_in_linear() -> None:
    model = _model()
    ref = copy.deepcopy(model)
    sm = fxsym.analyze(model, example_inputs=X)
    fxsym.resize(model, sm, {"3.out_channels": [4, 1]})
    cols = torch.cat([torch.arange(4 * 16, 5 * 16), torch.arange(16, 32)])
    assert torch.equal(model[6].weight, ref[6].weight[:, cols])
    assert model[6].in_features == 32


def test_int_choice_keeps_largest_l1_in_original_order() -> None:
    model = _model()
    with torch.no_grad():
        model[0].weight.mul_(0.01)
        model[0].weight[6].mul_(1000)
        model[0].weight[2].mul_(500)
    sm = fxsym.analyze(model, example_inputs=X)
    ref = copy.deepcopy(model)
    fxsym.resize(model, sm, {"0.out_channels": 2})
    assert torch.equal(model[0].weight, ref[0].weight[torch.tensor([2, 6])])


def test_failing_resize_rule_restores_every_module() -> None:
    model = _model()
    sm = fxsym.analyze(model, example_inputs=X)
    snap = _snapshot(model)
    from fxsym.registry import get_registry

    entry = get_registry().sym_info_entry(nn.Linear)
    assert entry is not None

    def broken(mod: nn.Module, name: str, index: torch.Tensor) -> None:
        raise RuntimeError("rule broke")

    class Plugin:
        @fxsym.hookimpl
        def fxsym_register_sym_infos(self, register):  # type: ignore[no-untyped-def]
            register(nn.Linear, entry.factory, resize=broken)

    pm = fxsym.load_plugins()
    pm.register(Plugin(), name="broken-resize")
    try:
        with pytest.warns(fxsym.PluginWarning), \
                pytest.raises(fxsym.ResizeError, match="rule broke"):
            fxsym.resize(model, sm, {"0.out_channels": [0, 1], "3.out_channels": [1, 2]})
    finally:
        pm.unregister(name="broken-resize")
    _assert_unchanged(model, snap)


def test_stale_symmap_and_wrong_model_are_refused() -> None:
    model = _model()
    sm = fxsym.analyze(model, example_inputs=X)
    with pytest.raises(fxsym.ResizeError, match="another model"):
        fxsym.resize(_model(), sm, {"0.out_channels": 2})
    fxsym.resize(model, sm, {"0.out_channels": 4})
    with pytest.raises(fxsym.ResizeError, match="analyze again"):
        fxsym.resize(model, sm, {"0.out_channels": 2})
    sm = fxsym.analyze(model, example_inputs=X)
    assert sm.group("0.out_channels").size == 4


def test_tied_parameters_stay_tied() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            self.mid = nn.Linear(8, 8)
            self.head = nn.Linear(8, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.mid(self.emb(ids))) + self.emb(ids))

    model = Tied()
    ids = torch.tensor([[1, 2, 3]])
    sm = fxsym.analyze(model, example_inputs=(ids,))
    g = sm.group("emb.embedding_dim")
    assert ("head", "in_features") in g.members
    fxsym.resize(model, sm, {"emb.embedding_dim": [7, 0, 3]})
    assert model.head.weight is model.emb.weight and model.emb.weight.shape == (10, 3)
    assert model(ids).shape == (1, 3, 10)


def test_shared_weight_is_one_group_and_is_never_untied() -> None:
    class TwoTowers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Embedding(10, 8)
            self.dec = nn.Embedding(10, 8)
            self.dec.weight = self.enc.weight
            self.out = nn.Linear(8, 3)

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.enc(a), self.out(torch.relu(self.dec(b)))  # enc's width is an output

    ids = torch.tensor([[1, 2]])
    # the shared weight ties enc's width to dec's: the output pins both
    assert fxsym.analyze(TwoTowers(), example_inputs=(ids, ids)).groups() == []
    model = TwoTowers()
    sm = fxsym.analyze(model, example_inputs=(ids, ids), outputs=[1])
    (group,) = sm.groups()
    assert {("enc", "embedding_dim"), ("dec", "embedding_dim")} <= set(group.members)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxsym.resize(model, sm, {group.name: [1, 5]})
    assert model.enc.weight is model.dec.weight and model.dec.weight.shape == (10, 2)
    assert model(ids, ids)[1].shape == (1, 2, 3)
