"""What oneDNN holds beyond a CPU convolution's tensors while its backward runs: blocked copies of its operands."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch

# torch's ConvParams::use_mkldnn (aten/src/ATen/native/Convolution.cpp) sends a float32 CPU convolution to
# oneDNN unless every one of these holds: a 1x1 kernel, a batch of one, no stride or dilation; below it, native is
# faster. Inputs this small (elements) with a kernel of at most 3x3 stay native at a batch of one as well.
NATIVE_MAX_ELEMENTS = 20480


def _op() -> Any:
    try:
        return torch.ops.aten.convolution_backward.default
    except (AttributeError, RuntimeError):
        return None


BACKWARD_OP = _op()


def channel_block() -> Optional[int]:
    """The channel block of oneDNN's blocked layouts on this CPU (16 with AVX-512, 8 with AVX2), or None where
    its copies were not measured (other CPUs: an ARM board's oneDNN runs through the Compute Library)."""
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # torch < 2.0 has no such call
        return None
    if capability.startswith("AVX512"):
        return 16
    if capability == "AVX2":
        return 8
    return None


def uses_onednn(inp: torch.Tensor, weight: torch.Tensor, stride: Sequence[int], dilation: Sequence[int],
                transposed: bool, groups: int) -> bool:
    """Whether torch runs this float32 CPU convolution with oneDNN (ConvParams::use_mkldnn's test)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    if inp.dtype != torch.float32 or inp.device.type != "cpu" or inp.dim() != 4 or transposed:
        return False
    batch, kernel = int(inp.shape[0]), tuple(int(k) for k in weight.shape[-2:])
    strided_or_dilated = any(int(s) != 1 for s in stride) or any(int(d) != 1 for d in dilation)
    not_native_1x1 = (strided_or_dilated or batch >= 16 or kernel != (1, 1) or torch.get_num_threads() > 1)
    worth_it = (groups > 1 or min(kernel) > 3 or batch > 1 or int(inp.numel()) > NATIVE_MAX_ELEMENTS)
    return not_native_1x1 and worth_it


def padded(channels: int, block: int) -> int:
    """Channels as oneDNN's blocked copy holds them: up to a multiple of `block`; an input of 4 to 8 channels is
    blocked by 8."""
    if channels <= 8:
        return 8
    return -(-channels // block) * block


def scratch_bytes(args: Tuple[Any, ...]) -> int:
    """Bytes oneDNN allocates and frees within one `aten::convolution_backward(*args)`: a blocked copy of the
    output's gradient (its channels padded to the block; where that gradient is not contiguous, as a sum's
    expanded ones are, torch's contiguous copy of it as well) and of the input (padded likewise; none for an
    input of at most 3 channels, which oneDNN reads as it is). 0 where torch would not run it with oneDNN, for a
    transposed convolution (not measured) and on a CPU whose blocking was not measured. Measured against the
    resident high-water mark of one backward: docs/prediction.md."""
    if BACKWARD_OP is None:
        return 0
    named = dict(zip((a.name for a in BACKWARD_OP._schema.arguments), args))
    grad_out, inp, weight = (named.get(k) for k in ("grad_output", "input", "weight"))
    if len(named) < 10 or not all(isinstance(t, torch.Tensor) for t in (grad_out, inp, weight)):
        return 0
    block = channel_block()
    if block is None or not uses_onednn(inp, weight, named["stride"], named["dilation"], bool(named["transposed"]),
                                        int(named["groups"])):
        return 0
    size = 0
    if not (grad_out.is_contiguous() or grad_out.is_contiguous(memory_format=torch.channels_last)):
        size += int(grad_out.numel()) * grad_out.element_size()  # made contiguous first (a sum's expanded ones)
    for t, copied in ((grad_out, True), (inp, int(inp.shape[1]) > 3)):
        if copied:
            channels = int(t.shape[1])
            size += int(t.numel()) // channels * padded(channels, block) * t.element_size()
    return size


def held_during(func: Any, args: Tuple[Any, ...]) -> Optional[torch.Tensor]:
    """oneDNN's copies for a convolution's backward as a tensor to hold while the op runs; None for any other op
    or where it holds none."""
    if BACKWARD_OP is None or func is not BACKWARD_OP:
        return None
    size = scratch_bytes(args)
    if size <= 0:
        return None
    return torch.empty(size, dtype=torch.uint8, device=args[1].device)
