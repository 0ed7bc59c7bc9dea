"""The predictor's max batch for the guided search (`mtbench maxbatch --search guided`), in a process of its own."""
from __future__ import annotations

import multiprocessing
from typing import Any, List, Optional, Tuple

from mtbench.errors import UsageError


def predicted_max_batch(model: str, target: str, overrides: List[str], anchor: int) -> Tuple[Optional[int], str]:
    """The predictor's max batch for `model` under the probes' overrides, or (None, why) where it has none: the
    guided search then falls back to the full one. The prediction runs in a process of its own: its trace runs
    autograd, after which torch refuses autograd in every process this one forks ("Unable to handle autograd's
    threading in combination with fork-based multiprocessing"), and each probe is such a fork."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_predict_in_child, args=(sender, model, target, overrides, anchor),
                            name="mtbench-predict")
    child.start()
    sender.close()
    try:
        kind, payload = receiver.recv()
    except EOFError:  # it died before it answered (the OOM killer, a signal)
        child.join()
        return None, f"no prediction (its process ended with exit code {child.exitcode}); the full search runs instead"
    finally:
        receiver.close()
    child.join()
    if kind == "usage":
        raise UsageError(payload)
    return payload


def _predict_in_child(sender: Any, model: str, target: str, overrides: List[str], anchor: int) -> None:
    from mtbench.predict.predictor import Predictor

    device = next((o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("device=")), "auto")
    rest = [o for o in overrides if not o.startswith(("target=", "device="))]
    try:
        predictor = Predictor(target_name=target, device=device, overrides=tuple(rest))
        answer: Tuple[str, Any] = ("ok", predictor.max_batch(model, anchor))
    except UsageError as exc:
        answer = ("usage", str(exc))
    except Exception as exc:  # noqa: BLE001 - the model cannot be traced: the full search needs no prediction
        answer = ("ok", (None, f"no prediction ({type(exc).__name__}: {exc}); the full search runs instead"))
    sender.send(answer)
    sender.close()
