"""Accelerators diffllm knows: memory and dense bf16 peak, for the planner (`gpu=h100`) and for MFU (device names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .errors import UserError


@dataclass(frozen=True)
class GPU:
    name: str  # the planner's key: `diffllm plan gpu=h100`
    match: tuple[str, ...]  # substrings of torch.cuda.get_device_name() that mean this device (upper case)
    memory_gib: float  # what the framework sees (nvidia-smi total, MiB / 1024), not the marketing GB
    bf16_tflops: float  # dense (no 2:4 sparsity) bf16 tensor-core peak: the MFU denominator
    source: str


# Device names are matched in this order and the first hit wins, so names that contain others come first
# ("GH200" contains "H200", "H200" contains "H20", "L40S" contains "L4").
_GPUS = (
    GPU("gh200", ("GH200",), 89.4, 989.0, "GH200 datasheet (96 GB HBM3 ~ 89.4 GiB), dense BF16 as H100 SXM"),
    GPU("h200", ("H200",), 140.4, 989.0, "H200 SXM datasheet (141 GB HBM3e), dense BF16"),
    GPU("h20", ("H20",), 89.4, 148.0, "H20 datasheet (96 GB ~ 89.4 GiB), dense BF16"),
    GPU("h100-pcie", ("H100 PCIE",), 79.6, 756.0, "H100 PCIe datasheet, dense BF16"),
    GPU("h100-nvl", ("H100 NVL",), 87.5, 835.0, "H100 NVL datasheet (94 GB ~ 87.5 GiB), dense BF16"),
    GPU("h100", ("H100", "H800"), 79.6, 989.0, "H100 SXM datasheet, dense BF16 (1979 is with sparsity); H800 alike"),
    GPU("b200", ("B200",), 179.1, 2250.0, "HGX B200 datasheet: 4.5 PF BF16 with sparsity -> 2.25 PF dense"),
    GPU("a100-40gb", ("A100-SXM4-40GB", "A100-PCIE-40GB"), 40.0, 312.0, "A100 datasheet (SXM), dense BF16"),
    GPU("a100-80gb", ("A100", "A800"), 80.0, 312.0, "A100 datasheet (SXM), dense BF16; A800 alike"),
    GPU("l40s", ("L40S",), 45.0, 362.0, "L40S datasheet, dense BF16 (733 with sparsity)"),
    GPU("l4", ("L4",), 22.4, 121.0, "L4 datasheet (24 GB ~ 22.4 GiB), dense BF16"),
    GPU("a10g", ("A10G",), 22.4, 70.0, "A10G (24 GB ~ 22.4 GiB), dense BF16"),
    GPU("mi250x", ("MI250X",), 128.0, 383.0, "MI250X datasheet (both dies), dense BF16"),
    GPU("mi300x", ("MI300X",), 192.0, 1307.0, "MI300X datasheet, dense BF16"),
)
GPUS = {g.name: g for g in _GPUS}


def lookup(name: str) -> GPU:
    """The planner's `gpu=<name>`."""
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise UserError(f"gpu={name}: unknown GPU type (known: {', '.join(GPUS)})") from None


def peak_tflops(device_name: str) -> Optional[float]:
    """The dense bf16 peak of a device by its name, or None when unknown (a CPU, an unlisted GPU): MFU is then n/a."""
    name = device_name.upper()
    return next((g.bf16_tflops for g in _GPUS if any(m in name for m in g.match)), None)


def gpu_table() -> str:
    rows = ["| gpu | memory (GiB) | dense bf16 peak (TFLOP/s) | source |", "|---|---|---|---|"]
    rows += [f"| {g.name} | {g.memory_gib:g} | {g.bf16_tflops:g} | {g.source} |" for g in _GPUS]
    return "\n".join(rows)
