"""The breakdown in `mtbench report` (a stacked bar per model across batch sizes) and in the console summary."""
from __future__ import annotations

import json

from mtbench.results.console import breakdown_line
from mtbench.report import make_report

PARTS = {"parameters": 50 << 20, "gradients": 50 << 20, "optimizer_state": 50 << 20, "inputs": 1 << 20, "other": 5 << 20}


def _summary(model: str, batch: int, breakdown, success: bool = True) -> dict:
    return {"schema": "mtbench.summary/1", "model": model, "batch_size": batch, "device": "cpu", "data": "synthetic",
            "success": success, "failure": None if success else {"kind": "budget", "message": "over"},
            "mem_peak_bytes": 300 << 20, "mem_breakdown_bytes": breakdown,
            "unavailable": {} if breakdown else {"mem_breakdown_bytes": "needs torch >= 2.5"}}


def test_report_draws_the_breakdown_and_names_models_without_one(tmp_path):
    for i, (model, batch, ok) in enumerate([("vgg16", 2, True), ("vgg16", 8, False), ("resnet50", 2, True)]):
        job = tmp_path / f"{i}-{model}-b{batch}"
        job.mkdir()
        parts = {**PARTS, "activations": (30 * batch) << 20, "tracked_peak": 0}
        (job / "summary.json").write_text(json.dumps(_summary(model, batch, parts, ok)))
    (tmp_path / "3-dqn-b2").mkdir()
    (tmp_path / "3-dqn-b2" / "summary.json").write_text(json.dumps(_summary("dqn", 2, None)))
    out = make_report(tmp_path)
    png = out / "memory_breakdown.png"
    assert png.stat().st_size > 10_000
    assert "memory_breakdown.png" in (out / "README.md").read_text()


def test_console_line_gives_the_parts_or_the_reason():
    line = breakdown_line({"mem_breakdown_bytes": {**PARTS, "activations": 3 << 20, "tracked_peak": 159 << 20}})
    assert line.startswith("params 50.0 MiB, grads 50.0 MiB, optimizer 50.0 MiB, activations 3.0 MiB")
    assert line.endswith("of 159.0 MiB tracked (one extra step)")
    assert breakdown_line(_summary("dqn", 2, None)) == "n/a (needs torch >= 2.5)"
