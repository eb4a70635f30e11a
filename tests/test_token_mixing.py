"""Token-mixing MLPs (MLP-Mixer, issue 21 §2): a Linear over the token dim of ``[B, C, N]``.

A Linear treats every dim before its last as a batch dim, so the channels ``C`` pass through
the token MLP unchanged and stay the channel group of the residual stream. The token dim
``N`` comes from the input resolution (the patch grid): a size no group produces, so the token
MLP's input is fixed, with a reason; its hidden width is a group of its own.
"""

from __future__ import annotations

import torch
from helpers import assert_oracles, group_with
from torch import nn

import fxsym


class MixerBlock(nn.Module):
    def __init__(self, channels: int = 6, tokens: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 2, stride=2)
        self.norm1 = nn.LayerNorm(channels)
        self.tok1 = nn.Linear(tokens, 5)
        self.tok2 = nn.Linear(5, tokens)
        self.norm2 = nn.LayerNorm(channels)
        self.ch1 = nn.Linear(channels, 8)
        self.ch2 = nn.Linear(8, channels)
        self.head = nn.Linear(channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)  # [B, N, C]
        t = self.tok2(torch.relu(self.tok1(self.norm1(x).transpose(1, 2))))
        x = x + t.transpose(1, 2)
        x = x + self.ch2(torch.relu(self.ch1(self.norm2(x))))
        return self.head(x.mean(1))


def test_channels_pass_through_a_token_mixing_linear() -> None:
    torch.manual_seed(0)
    model = MixerBlock().eval()
    x = torch.randn(2, 3, 4, 4)
    sm = assert_oracles(model, (x,))
    channels = group_with(sm, "stem", "out_channels")
    assert ("ch2", "out_features") in channels.members
    assert ("norm1", "normalized_shape") in channels.members or any(
        m[0] == "norm1" for m in channels.members)
    hidden = group_with(sm, "tok1", "out_features")
    assert ("tok2", "in_features") in hidden.members
    assert sm.why_constant("tok2", "out_features")  # the token dim: the input's patch grid
    sizes = {g.name: max(1, g.size // 2) for g in sm.groups()}
    fxsym.resize(model, sm, sizes)
    assert model.stem.out_channels == 3 and model.tok1.out_features == 2
    assert model(x).shape == (2, 3)


class TokenMLP(nn.Module):
    """A patch embedding and one token-mixing MLP: the token dim is the patch grid of the
    input (8 x 8 pixels in patches of 2: 16 tokens), which no weight produces."""

    def __init__(self, channels: int = 4, tokens: int = 16) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, channels, 2, stride=2)
        self.tok1 = nn.Linear(tokens, 6)
        self.tok2 = nn.Linear(6, tokens)
        self.head = nn.Linear(channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2)  # [B, C, N]
        x = x + self.tok2(torch.relu(self.tok1(x)))
        return self.head(x.mean(2))


def test_a_token_dim_pinned_by_the_input_resolution_says_so() -> None:
    # tok2's output is the token dim, set by the input's height and width (a larger image has
    # more patches): the pin names the input dims, proven by running the patch embedding at
    # other input sizes, not by comparing numbers
    model = TokenMLP().eval()
    x = (torch.randn(2, 3, 8, 8),)
    calls: list[int] = []
    hook = model.patch.register_forward_hook(lambda *_: calls.append(1))
    fxsym.analyze(model, example_inputs=x)
    assert not calls  # the runs at other input sizes call shadows: the user's hook never runs
    hook.remove()
    sm = assert_oracles(model, x)
    assert [g.name for g in sm.groups()] == ["patch.out_channels", "tok1.out_features"]
    why = sm.why_constant("tok2", "out_features")
    assert why == ("meets a dimension of fixed size set by the input's shape: the 16 entries "
                   "of dim 2 of flatten follow dims 2, 3 of input 'x' (8 x 8); a different "
                   "input size changes them, a resize cannot"), why
    assert any(e.where == "node add" and e.message == why for e in sm.trace_report)


def test_a_fixed_size_no_input_sets_keeps_the_plain_reason() -> None:
    class Offset(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.out = nn.Linear(4, 8), nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.fc(x) + torch.arange(8.0))

    model = Offset().eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(3, 4),))
    assert not sm.groups()
    assert sm.why_constant("fc", "out_features") == "meets a dimension of fixed size"
