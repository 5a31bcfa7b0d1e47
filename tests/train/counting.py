"""Counting on CPU what a GPU step pays for: host syncs, blocking batch copies and collectives, per training step,
each attributed to the code that made it (diffllm's, DeepSpeed's, torch's) by its calling frames.

    with Counter() as counter:                    # patches installed (originals kept), counting off
        hooks = [..., Counting(counter, first=3, last=6)]   # on for steps 3-6 (a hook: the trainer's own API)
        ... train ...
    counter.steps[4]                              # StepCount of step 4: syncs, copies, collectives by owner

What counts as a host sync (on a GPU each stalls the host until the stream drains; on CPU it is free but countable):
`Tensor.item`, `tolist`, `__bool__`, `__float__`, `__int__`, `__index__`, `nonzero`, `cpu`, `numpy`, and indexing
with a bool tensor (a data-dependent shape). Not counted: torch.optim making and reading its step counters
(`_init_group`, `_get_value`), which torch keeps on the host (unless capturable/fused) precisely so that reading them
is no sync; and values computed on the host from what was read back (HostTensors). A blocking copy: a
`Batch.to(device)` without `non_blocking=True` (a pageable host-to-device copy that waits), and `torch.tensor` /
`torch.as_tensor` with a `device=` (host data uploaded: on CUDA the copy waits for the stream). A collective: a call of
`torch.distributed.X` or `torch.distributed.distributed_c10d.X` (DeepSpeed's comm layer calls them by attribute) for X
in COLLECTIVES, and of the all-gather and reduce-scatter functions DeepSpeed's comm backend looked up when it was
created (`cdb.all_gather_function`, `cdb.reduce_scatter_function`: the ZeRO parameter all-gathers and gradient
reduce-scatters); a collective called inside another one (all_gather_object's all_gather) is not counted twice.

The owner of an event is the package of the innermost calling frame that is diffllm's or DeepSpeed's (torch's own
frames in between are looked through: a sync inside `torch.nn.utils` called by DeepSpeed is DeepSpeed's); "torch" when
none is (a sync inside torch called from elsewhere), "other" for anything else (a test's own code).

tests/train/counted_step.py drives a real step with it (`count_steps`, `count_all`)."""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections import Counter as Tally
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from diffllm.train.hooks import Hook

SYNC_METHODS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "nonzero", "cpu", "numpy")
COLLECTIVES = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
    "all_gather",
    "reduce",
    "_all_gather_base",
    "_reduce_scatter_base",
    "all_reduce_coalesced",
    "reduce_scatter",
    "all_to_all_single",
    "all_gather_object",
    "broadcast_object_list",
    "gather",
    "scatter",
    "barrier",
)
OWNERS = ("diffllm", "deepspeed", "torch", "other")


def _root(module) -> str:
    return str(Path(module.__file__).resolve().parent) + "/"


@dataclass
class Event:
    kind: str  # sync | copy | collective
    name: str  # the method or collective
    owner: str  # diffllm | deepspeed | torch | other
    site: str  # file:line (function) of the owner's frame
    nbytes: int = 0  # collectives: bytes of the tensors passed


@dataclass
class StepCount:
    """What one step cost (from the end of the step before, through this step's hooks)."""

    step: int
    events: list = field(default_factory=list)

    def count(self, kind: str, owner: Optional[str] = None) -> int:
        return sum(e.kind == kind and (owner is None or e.owner == owner) for e in self.events)

    @property
    def syncs(self) -> int:
        """Host syncs, all owners, blocking copies included (each is one)."""
        return self.count("sync") + self.count("copy")

    @property
    def diffllm_syncs(self) -> int:
        return self.count("sync", "diffllm") + self.count("copy", "diffllm")

    @property
    def collectives(self) -> int:
        return self.count("collective")

    def sites(self, kind: Optional[str] = None) -> dict[str, int]:
        """{"owner name site": calls} of the step's events (of one kind), for reading a failure."""
        return dict(Tally(f"{e.owner} {e.kind}:{e.name} {e.site}" for e in self.events if kind in (None, e.kind)))

    def summary(self) -> dict:
        syncs = {o: self.count("sync", o) + self.count("copy", o) for o in OWNERS}
        collectives = {o: self.count("collective", o) for o in OWNERS}
        return {
            "syncs": self.syncs,
            "syncs_by_owner": {o: n for o, n in syncs.items() if n},
            "blocking_copies": self.count("copy"),
            "collectives": self.collectives,
            "collectives_by_owner": {o: n for o, n in collectives.items() if n},
            "collective_bytes": sum(e.nbytes for e in self.events if e.kind == "collective"),
        }


class HostTensors(TorchFunctionMode):
    """Which tensors live on the host in a GPU run, as far as a CPU run can tell: what `.cpu()` / `.numpy()` read
    back, and whatever torch computes from such tensors alone (a value computed on the host from a readback: no
    further sync). Tensors are kept by id with a weak reference (a WeakSet would compare tensors elementwise)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[int, weakref.ref] = {}

    def add(self, t) -> None:
        if isinstance(t, torch.Tensor):
            key = id(t)
            self.ids[key] = weakref.ref(t, lambda _, key=key: self.ids.pop(key, None))

    def __contains__(self, t) -> bool:
        ref = self.ids.get(id(t))
        return ref is not None and ref() is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if inputs and all(t in self for t in inputs):
            for t in tree_leaves(out):
                self.add(t)
        return out


class Counter:
    """The patches (installed on __enter__, removed on __exit__) and what they counted while `on`."""

    def __init__(self) -> None:
        import deepspeed

        import diffllm

        self.roots = {"diffllm": _root(diffllm), "deepspeed": _root(deepspeed), "torch": _root(torch)}
        self.here = str(Path(__file__).resolve())
        self.on = False
        self.current: Optional[StepCount] = None
        self.steps: dict[int, StepCount] = {}
        self._undo: list[Callable[[], None]] = []
        self._inside = threading.local()
        self.host, self.tracking = HostTensors(), False

    # ----- attribution ------------------------------------------------------------------------------------------
    def owner(self) -> Optional[tuple[str, str]]:
        """(owner, site) of the calling code, or None for a read that is no sync (torch.optim's host step count)."""
        frame = sys._getframe(2)
        seen_torch = None
        while frame is not None:
            path = frame.f_code.co_filename
            if path != self.here:
                if path.startswith(self.roots["torch"]):
                    if frame.f_code.co_name in ("_get_value", "_init_group") and "/optim/" in path:
                        return None  # the optimizer's step counters: host tensors unless capturable/fused
                    seen_torch = seen_torch or frame
                else:
                    name = next((n for n in ("diffllm", "deepspeed") if path.startswith(self.roots[n])), None)
                    if name is not None:
                        return name, self._site(frame, self.roots[name])
                    if seen_torch is None:  # a test's own call, torch not involved
                        return "other", self._site(frame, "")
            frame = frame.f_back
        return ("torch", self._site(seen_torch, self.roots["torch"])) if seen_torch else ("other", "?")

    @staticmethod
    def _site(frame, root: str) -> str:
        return f"{frame.f_code.co_filename.removeprefix(root)}:{frame.f_lineno} ({frame.f_code.co_name})"

    def record(self, kind: str, name: str, nbytes: int = 0) -> None:
        if not self.on or self.current is None or getattr(self._inside, "depth", 0):
            return
        who = self.owner()
        if who is not None:
            self.current.events.append(Event(kind, name, who[0], who[1], nbytes))

    @contextlib.contextmanager
    def once(self):
        """True for the outermost of nested patched calls on this thread (a torch function mode dispatches a call to
        the patched attribute a second time)."""
        depth = getattr(self._inside, "calls", 0)
        self._inside.calls = depth + 1
        try:
            yield depth == 0
        finally:
            self._inside.calls = depth

    # ----- the window -------------------------------------------------------------------------------------------
    def start(self, step: int) -> None:
        self.current, self.on = self.steps.setdefault(step, StepCount(step)), True

    def stop(self) -> None:
        if self.tracking:
            self.host.__exit__(None, None, None)
        self.on, self.current, self.tracking = False, None, False

    def read_back(self, t) -> None:
        """`t` was read back to the host: track what is computed from it (the mode goes on at the first readback of
        a window: before it, no tensor is the host's, and the forward runs without the mode's cost)."""
        if not self.tracking:
            self.host.__enter__()
            self.tracking = True
        self.host.add(t)

    # ----- the patches ------------------------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        original = owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def __enter__(self) -> Counter:
        from diffllm.data.batch import Batch

        counter = self

        def sync(name: str):
            def make(original):
                def wrapper(self, *args, **kwargs):
                    with counter.once() as first:  # a mode's dispatch calls the patched method again: count once
                        if first and counter.on and self not in counter.host:
                            counter.record("sync", name)
                        out = original(self, *args, **kwargs)
                    if counter.on and name == "cpu":
                        counter.read_back(out)
                    return out

                return wrapper

            return make

        for name in SYNC_METHODS:
            self._patch(torch.Tensor, name, sync(name))

        def getitem(original):
            def wrapper(self, index):
                with counter.once() as first:
                    if first and counter.on and _bool_index(index) and self not in counter.host:
                        counter.record("sync", "getitem[bool]")
                    return original(self, index)

            return wrapper

        self._patch(torch.Tensor, "__getitem__", getitem)

        def batch_to(original):
            def wrapper(self, device, *args, **kwargs):
                if not kwargs.get("non_blocking", args[0] if args else False):
                    counter.record("copy", "Batch.to")
                return original(self, device, *args, **kwargs)

            return wrapper

        self._patch(Batch, "to", batch_to)

        def upload(name: str):
            def make(original):
                def wrapper(*args, **kwargs):
                    with counter.once() as first:
                        if first and kwargs.get("device") is not None:  # host data copied to the device, blocking
                            counter.record("copy", f"torch.{name}(device=)")
                        return original(*args, **kwargs)

                return wrapper

            return make

        for name in ("tensor", "as_tensor"):
            self._patch(torch, name, upload(name))

        def collective(name: str):
            def make(original):
                def wrapper(*args, **kwargs):
                    counter.record("collective", name, _nbytes(args, kwargs))
                    depth = getattr(counter._inside, "depth", 0)
                    counter._inside.depth = depth + 1
                    try:
                        return original(*args, **kwargs)
                    finally:
                        counter._inside.depth = depth

                return wrapper

            return make

        for name in COLLECTIVES:
            for module in {dist, c10d}:
                if hasattr(module, name):
                    self._patch(module, name, collective(name))
        backend = getattr(sys.modules.get("deepspeed.comm.comm"), "cdb", None)  # DeepSpeed's comm backend keeps
        for attr, name in (
            ("all_gather_function", "all_gather_into_tensor"),
            ("reduce_scatter_function", "reduce_scatter_tensor"),
        ):
            if getattr(backend, attr, None) is not None:  # the functions it looked up when it was created
                self._patch(backend, attr, collective(name))
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        for undo in reversed(self._undo):
            undo()
        self._undo = []


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _nbytes(args, kwargs) -> int:
    def size(x) -> int:
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, (list, tuple)):
            return sum(size(y) for y in x)
        return 0

    return sum(size(a) for a in (*args, *kwargs.values()))


class Counting(Hook):
    """A trainer hook that counts steps `first`..`last`: each step's count runs
    from the end of the step before (this hook's on_step_end, so put it last) to the end of its own hooks."""

    def __init__(self, counter: Counter, first: int, last: int) -> None:
        self.counter, self.first, self.last = counter, first, last

    def _open(self, step: int) -> None:
        self.counter.stop()
        if self.first <= step <= self.last:
            self.counter.start(step)

    def on_start(self, view) -> None:
        self._open(view.state.step + 1)

    def on_step_end(self, view, record) -> None:
        self._open(view.state.step + 1)
