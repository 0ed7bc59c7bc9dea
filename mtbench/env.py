"""What the result was measured on: versions, host, device name."""
from __future__ import annotations

import os
import platform
from typing import Any, Dict


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                # x86 says "model name"; ARM kernels (Jetson) often give only "Hardware" / "CPU part"
                if line.lower().startswith(("model name", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> Dict[str, Any]:
    """The machine, without importing torch (mtbench-sample uses this alone)."""
    import numpy

    import mtbench

    return {
        "versions": {"mtbench": mtbench.__version__, "python": platform.python_version(), "numpy": numpy.__version__},
        "host": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "device_name": cpu_model(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
    }


def describe(device: Any) -> Dict[str, Any]:
    """host() plus the torch stack and the training device."""
    import hydra
    import torch
    import torchvision

    out = host()
    out["versions"].update({
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "hydra": hydra.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    })
    out["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    out["torch_threads"] = torch.get_num_threads()
    return out
