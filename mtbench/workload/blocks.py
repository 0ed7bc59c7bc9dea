"""A network as a sequence of blocks, derived from its ordered children and checked against its own forward."""
from __future__ import annotations

import logging
from typing import Callable, List, Optional, Sequence

import torch
from torch import nn


def _has_linear(m: nn.Module) -> bool:
    return any(isinstance(sub, nn.Linear) for sub in m.modules())


def _expand(children: Sequence[nn.Module]) -> List[nn.Module]:
    """Plain nn.Sequential children become their elements (ResNet's layer1 -> its bottlenecks, VGG's features -> its
    layers), so segments can be cut finely; an in-place module (ReLU(inplace=True)) joins the block before it, so no
    segment starts by overwriting the input its recomputation needs."""
    out: List[nn.Module] = []
    for child in children:
        if isinstance(child, nn.Sequential) and type(child).forward is nn.Sequential.forward:
            inner = _expand(list(child))
        else:
            inner = [child]
        for m in inner:
            if getattr(m, "inplace", False) and out:
                prev = out.pop()
                prev_parts = list(prev) if isinstance(prev, _Joined) else [prev]
                out.append(_Joined(*prev_parts, m))
            else:
                out.append(m)
    return out


class _Joined(nn.Sequential):
    """Two or more blocks run as one (the parameters stay the network's own modules)."""


def _candidates(net: nn.Module) -> List[List[nn.Module]]:
    """Orders that a CNN's forward commonly follows: the children in order with the flatten before the classifier
    (the first child that holds a Linear), also with a global average pool before it (MobileNetV2), or a flatten
    at the end (SqueezeNet, whose classifier is convolutional)."""
    children = [c for c in net.children() if c is not None]
    head = next((i for i, c in enumerate(children) if _has_linear(c)), None)
    out: List[List[nn.Module]] = []
    if head is not None:
        body, tail = children[:head], children[head:]
        out.append(body + [nn.Flatten(1)] + tail)
        out.append(body + [nn.AdaptiveAvgPool2d(1), nn.Flatten(1)] + tail)
    out.append(children + [nn.Flatten(1)])
    return out


def same_output(net: nn.Module, blocks: Sequence[nn.Module], sample: torch.Tensor) -> bool:
    """Whether running the blocks in order gives net(sample) (eval mode, no grad; the modes are restored). On fake
    tensors (the predictor's trace), which have no values, the shapes must agree."""
    modes = [m.training for m in net.modules()]
    net.eval()
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    was_disabled, quiet.disabled = quiet.disabled, True  # a candidate that fails on fake tensors is logged there
    try:
        with torch.no_grad():
            expected = net(sample)
            got = sample
            for block in blocks:
                got = block(got)
    except Exception:  # a candidate whose shapes do not chain is simply not the network's order
        return False
    finally:
        quiet.disabled = was_disabled
        for m, mode in zip(net.modules(), modes):
            m.training = mode
    if not isinstance(expected, torch.Tensor) or expected.shape != got.shape:
        return False
    if is_fake(expected):
        return True
    return bool(torch.allclose(expected, got, atol=1e-5, rtol=1e-4))


def is_fake(t: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # torch without fake tensors: every tensor has values
        return False
    return isinstance(t, FakeTensor) or t.device.type == "meta"


def sequential_blocks(net: nn.Module, make_sample: Callable[[], torch.Tensor]) -> Optional[List[nn.Module]]:
    """The network's blocks, or None when no candidate order reproduces its forward on a sample."""
    sample = make_sample()
    for candidate in _candidates(net):
        blocks = _expand(candidate)
        if same_output(net, blocks, sample):
            return blocks
    return None
