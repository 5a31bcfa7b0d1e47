"""Accelerators the planner knows: memory and dense bf16 peak (no sparsity), looked up by name, never hard-coded."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float  # what the framework sees (nvidia-smi total, MiB / 1024), not the marketing GB
    bf16_tflops: float  # dense bf16 tensor-core peak, the MFU denominator
    source: str


GPUS = {g.name: g for g in (
    GPU("a100-40gb", 40.0, 312.0, "A100 datasheet (SXM), dense BF16"),
    GPU("a100-80gb", 80.0, 312.0, "A100 datasheet (SXM), dense BF16"),
    GPU("h100", 79.6, 989.0, "H100 SXM datasheet, dense BF16 (1979 is with sparsity)"),
    GPU("h100-pcie", 79.6, 756.0, "H100 PCIe datasheet, dense BF16"),
    GPU("h200", 140.4, 989.0, "H200 SXM datasheet (141 GB HBM3e), dense BF16"),
    GPU("b200", 179.1, 2250.0, "HGX B200 datasheet: 4.5 PF BF16 with sparsity -> 2.25 PF dense"),
    GPU("l40s", 45.0, 362.0, "L40S datasheet, dense BF16 (733 with sparsity)"),
    GPU("mi250x", 128.0, 383.0, "MI250X datasheet (both dies), dense BF16"),
    GPU("mi300x", 192.0, 1307.0, "MI300X datasheet, dense BF16"),
)}


def lookup(name: str) -> GPU:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise ValueError(f"gpu={name}: unknown GPU type (known: {', '.join(GPUS)})") from None


def gpu_table() -> str:
    rows = ["| gpu | memory (GiB) | dense bf16 peak (TFLOP/s) | source |", "|---|---|---|---|"]
    rows += [f"| {g.name} | {g.memory_gib:g} | {g.bf16_tflops:g} | {g.source} |" for g in GPUS.values()]
    return "\n".join(rows)
