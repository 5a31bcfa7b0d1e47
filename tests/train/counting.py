"""Counting on CPU what a GPU step pays for: host syncs, blocking batch copies and collectives, per training step,
each attributed to the code that made it (diffllm's, DeepSpeed's, torch's) by its calling frames.

    with Counter() as counter:                    # patches installed (originals kept), counting off
        hooks = [..., Counting(counter, first=3, last=6)]   # on for steps 3-6 (a hook: the trainer's own API)
        ... train ...
    counter.steps[4]                              # StepCount of step 4: syncs, copies, collectives by owner

What counts as a host sync (on a GPU each stalls the host until the stream drains; on CPU it is free but countable):
`Tensor.item`, `tolist`, `__bool__`, `__float__`, `__int__`, `__index__`, `nonzero`, `cpu`, `numpy`, and indexing
with a bool tensor (a data-dependent shape). Not counted: torch.optim's `_get_value` reading its step counters, which
torch keeps on the host (unless capturable/fused) precisely so that reading them is no sync. A blocking copy: a
`Batch.to(device)` without `non_blocking=True` (a pageable host-to-device copy that waits). A collective: a call of
`torch.distributed.X` or `torch.distributed.distributed_c10d.X` (DeepSpeed's comm layer calls them by attribute) for X
in COLLECTIVES, and of the all-gather and reduce-scatter functions DeepSpeed's comm backend looked up when it was
created (`cdb.all_gather_function`, `cdb.reduce_scatter_function`: the ZeRO parameter all-gathers and gradient
reduce-scatters); a collective called inside another one (all_gather_object's all_gather) is not counted twice.

The owner of an event is the package of the innermost calling frame that is diffllm's or DeepSpeed's (torch's own
frames in between are looked through: a sync inside `torch.nn.utils` called by DeepSpeed is DeepSpeed's); "torch" when
none is (a sync inside torch called from elsewhere), "other" for anything else (a test's own code).

`count_steps(spec)` drives a real step (a DeepSpeed engine, the trainer's Step, its built-in per-step hooks) on
in-memory batches and returns the counts of a window of steps; `count_all(specs)` runs many configurations in one
process (one `run_distributed` launch serves a whole table)."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import threading
import warnings
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
                    if frame.f_code.co_name == "_get_value" and "/optim/" in path:
                        return None  # the optimizer's step counter: a host tensor unless capturable/fused
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
                if counter.on and _bool_index(index) and self not in counter.host:
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


# ----- a real step on in-memory batches -------------------------------------------------------------------------
@dataclass
class Spec:
    """One configuration of `count_steps`: a tiny model (d_model 32), micro-batches of 2 x 16 tokens with a loss mask,
    4 steps with log_every 4 (counted: steps FIRST..LAST: step 3 a plain step, step 4 a logged one); nan_grad_at: a
    step whose gradients (not its loss) rank 0 makes NaN."""

    stage: int = 2
    precision: str = "fp32"
    layers: int = 2
    accum: int = 1
    diagnostics: str = "full"
    arch: str = "diff"
    nan_grad_at: Optional[int] = None
    offload: bool = False  # trainer.offload_optimizer: DeepSpeed's CPU Adam
    steps: int = 4
    log_every: int = 4

    @property
    def name(self) -> str:
        extra = "" if self.arch == "diff" else f"-{self.arch}"
        extra += (f"-nan{self.nan_grad_at}" if self.nan_grad_at else "") + ("-offload" if self.offload else "")
        return f"zero{self.stage}-{self.precision}-L{self.layers}-accum{self.accum}-{self.diagnostics}{extra}"


FIRST, LAST = 3, 4
TIMINGS = ("step_time_s", "time", "elapsed_s", "tokens_per_s", "mfu")  # left out of the records returned


class _NanGrad(torch.autograd.Function):
    """The identity forward; a NaN gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * math.nan


class NanGradient(Hook):
    """Rank 0's gradients at `step` become NaN (its loss stays finite): only the gradient says the step is bad.
    Keeps this rank's fp32 weights (pieces) before and after that step, to tell whether the update was dropped."""

    def __init__(self, step: int, engine) -> None:
        self.step, self.engine = step, engine
        self.weights: list = []

    def snapshot(self) -> list:
        from deepspeed.utils import safe_get_local_fp32_param

        params = list(self.engine.module.parameters())
        zero3 = any(hasattr(p, "ds_id") for p in params)
        return [(safe_get_local_fp32_param(p) if zero3 else p).detach().clone() for p in params]

    def on_step_start(self, view) -> None:
        if view.state.step + 1 == self.step:
            self.weights.append(self.snapshot())

    def on_loss(self, view, loss):
        return _NanGrad.apply(loss) if view.state.step + 1 == self.step and view.rank == 0 else loss

    def on_step_end(self, view, record) -> None:
        if view.state.step == self.step:
            self.weights.append(self.snapshot())

    def kept(self) -> bool:
        return len(self.weights) == 2 and all(torch.equal(a, b) for a, b in zip(*self.weights))


class WeightNorms(Hook):
    """A float64 reference of each block's fp32 weight norm after `step`'s update, from the full fp32 weights
    (DeepSpeed's safe_get_full_fp32_param under ZeRO: a collective per parameter, so after the counted window;
    without ZeRO the parameters themselves, fp32 runs only)."""

    def __init__(self, step: int, engine) -> None:
        self.step, self.engine, self.norms = step, engine, None

    def on_step_end(self, view, record) -> None:
        from deepspeed.utils import safe_get_full_fp32_param

        if view.state.step != self.step:
            return
        out = []
        for block in self.engine.module.layers:
            full = [safe_get_full_fp32_param(p) for p in block.parameters()]
            full = [p if f is None else f for p, f in zip(block.parameters(), full)]
            out.append(math.sqrt(sum(float(f.detach().double().pow(2).sum()) for f in full)))
        self.norms = out


def count_steps(spec: Spec, world_size: int) -> dict:
    """Train spec.steps steps of a real engine (this process group) with the trainer's Step and its built-in per-step
    hooks (the diagnostics at spec.diagnostics), counting steps FIRST..LAST: {"plain": [summary of each plain step],
    "logged": [...], "sites": {step: sites}, "records": {step: its record}, "kept": whether nan_grad_at's update was
    dropped on this rank, "reference": WeightNorms' after step LAST, "optimizer": the optimizer's class names,
    "parameters": the model's parameter tensors, "persistent": ZeRO-3's persistent ones}."""
    import tempfile

    from diffllm.budget import plan_budget
    from diffllm.data.batch import Batch
    from diffllm.model import ModelConfig
    from diffllm.train.config import OptimConfig, SpikesConfig, TrainerConfig
    from diffllm.train.diagnostics import diagnostics_hooks
    from diffllm.train.engine import build_engine, deepspeed_config
    from diffllm.train.hooks import Checkpointing, Hooks, StepMetrics
    from diffllm.train.metrics import logged
    from diffllm.train.optim import UpdateGate
    from diffllm.train.signals import StopFlag
    from diffllm.train.spikes import SpikeGuard
    from diffllm.train.step import Asks, Step
    from diffllm.train.watchdog import Watchdog
    from tests.train.helpers import make_view

    seq, micro = 16, 2
    trainer = TrainerConfig(
        zero_stage=spec.stage,
        micro_batch_size=micro,
        global_batch_tokens=seq * micro * spec.accum * world_size,
        tokens=seq * micro * spec.accum * world_size * spec.steps,
        precision=spec.precision,
        diagnostics=spec.diagnostics,
        log_every=spec.log_every,
        offload_optimizer=spec.offload,
    )
    opt = OptimConfig(lr=1e-2, warmup_steps=2, schedule="linear", min_lr=1e-3)
    budget = plan_budget(trainer, seq, world_size)
    cfg = ModelConfig(arch=spec.arch, vocab_size=64, d_model=32, n_layers=spec.layers, n_heads=4, max_seq_len=seq)
    ds = deepspeed_config(trainer, opt, budget, spec.precision)
    engine, optimizer = build_engine(cfg, trainer, opt, ds, 0, UpdateGate())
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    batches = [
        Batch(
            tokens=torch.randint(0, 64, (micro, seq + 1), generator=g),
            loss_mask=torch.rand(micro, seq + 1, generator=g) < 0.8,
        )
        for _ in range(spec.steps * spec.accum)
    ]
    asks = Asks(StopFlag())
    nan = NanGradient(spec.nan_grad_at or 0, engine)
    with tempfile.TemporaryDirectory() as tmp, Counter() as counter:
        view = make_view(Path(tmp), steps=budget.steps, request_save=asks.request_save)
        view.model, view.budget, view.rank, view.world_size = lambda: engine, budget, dist.get_rank(), world_size
        step = Step(
            engine, optimizer, iter(batches), SpikeGuard(SpikesConfig()), budget, opt, torch.device("cpu"), Watchdog(0)
        )
        built_in = [
            StepMetrics(spec.log_every, 1.0, None),
            *diagnostics_hooks(spec.diagnostics, spec.log_every),
            Checkpointing(0, 0),
        ]
        reference = WeightNorms(LAST, engine)
        hooks = Hooks([*built_in, nan, Counting(counter, FIRST, LAST), reference], view)
        hooks.call("on_start")
        kinds, records = {}, {}
        for _ in range(budget.steps):
            record, _ = step(view.state, hooks, asks)
            record = hooks.step_end(record)
            kinds[record["step"]] = "logged" if logged(record, spec.log_every, budget.steps) else "plain"
            records[record["step"]] = {k: v for k, v in record.items() if k not in TIMINGS}
            asks.save = False
        counter.stop()
    out: dict = {
        "plain": [],
        "logged": [],
        "sites": {},
        "records": records,
        "kept": nan.kept(),
        "reference": reference.norms,
        "optimizer": [c.__name__ for c in type(optimizer).__mro__],
        "parameters": len(list(engine.module.parameters())),
        "persistent": len(getattr(engine.optimizer, "persistent_parameters", None) or ()),  # ZeRO-3's
    }
    for s in range(FIRST, LAST + 1):
        out[kinds[s]].append(counter.steps[s].summary())
        out["sites"][s] = counter.steps[s].sites()
    return out


def count_all(specs: list[Spec]) -> dict[str, dict]:
    """count_steps of every spec in this process group, one after another: {spec.name: counts}."""
    import deepspeed

    from diffllm.train.dist import skip_shm_op

    skip_shm_op()
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)  # its "untested optimizer" line, once per engine
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)")
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    with contextlib.redirect_stdout(sys.stderr):
        return {spec.name: count_steps(spec, dist.get_world_size()) for spec in specs}
