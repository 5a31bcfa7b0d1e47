"""The host's speed in one line, printed before the suites run (`make test`, `make test-slow`), so that a suite's wall
time can be read against the machine that gave it: the suite's time is mostly the interpreter (Hydra composing
configs) and small fp32 matmuls on one thread each (tiny training runs), so those two are measured, with the load.

    python scripts/host_speed.py
    host: python 33.1 M loop steps/s, torch fp32 matmul 98.7 GFLOP/s (1 thread), 2 cores, load 1.16 (1 min)

Each figure is the best of 5 repeats (the least disturbed by other work); about 1.5 s in all."""

from __future__ import annotations

import os
import time


def loop_rate(n: int = 2_000_000) -> float:
    """Steps of a plain Python loop per second (what composing configs is made of)."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        total = 0
        for i in range(n):
            total += i & 7
        best = min(best, time.perf_counter() - start)
    return n / best


def matmul_rate(size: int = 256, repeat: int = 20) -> float:
    """fp32 FLOP/s of a size x size matmul on one thread (a tiny model's step is made of such)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(repeat):
                a @ b
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2 * size**3 * repeat / best


def main() -> None:
    load = os.getloadavg()[0]
    print(
        f"host: python {loop_rate() / 1e6:.1f} M loop steps/s, torch fp32 matmul {matmul_rate() / 1e9:.1f} GFLOP/s "
        f"(1 thread), {os.cpu_count()} cores, load {load:.2f} (1 min)",
        flush=True,
    )


if __name__ == "__main__":
    main()
