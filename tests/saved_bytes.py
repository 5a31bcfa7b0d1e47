"""The tests' own count of what autograd saves, by storage on real tensors: the independent reference for the
planner's meta-device count (diffllm.scaling.activations._saved_bytes, by tensor identity)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch


def saved_storage_bytes(fn: Callable[[], Any], params: Iterable[torch.Tensor]) -> tuple[int, Any]:
    """(bytes of the distinct storages autograd saves while `fn()` runs, parameters' storages excluded; fn's result)."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(storages.values()), out
