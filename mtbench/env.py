"""What the result was measured on: versions, host, device name."""
from __future__ import annotations

import os
import platform
from typing import Any, Dict

import torch


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


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def describe(device: torch.device) -> Dict[str, Any]:
    import hydra
    import numpy
    import torchvision

    import mtbench

    return {
        "versions": {
            "mtbench": mtbench.__version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "hydra": hydra.__version__,
            "numpy": numpy.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        },
        "host": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "device_name": device_name(device),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
