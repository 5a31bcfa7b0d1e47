"""A real training step counted (tests/train/counting.py's harness): `count_steps(spec)` trains a few steps of a real
DeepSpeed engine with the trainer's Step and its built-in per-step hooks on in-memory batches, counting a window of
steps; `count_all(specs)` runs many configurations in one process group (one `run_distributed` launch serves a whole
table: tests/train/test_counts.py, scripts/bench_counts.py)."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from diffllm.train.hooks import Hook
from tests.train.counting import Counter, Counting


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
# DeepSpeed's own default bucket sizes, larger than the tiny model: one gradient bucket per backward, so that the
# counts show the structure of the step. With diffllm's knobs (train/zero.py: d_model^2 elements, 1,024 here) the
# reduces are bucketed by design, ~parameters / d_model^2 of them per micro-batch, each overlapping the backward
# (docs/training.md "At scale"); tests/train/test_engine_config.py reads those knobs back from 2-rank engines.
ONE_BUCKET = {
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
}
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
        deepspeed={"zero_optimization": ONE_BUCKET},
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
        view = make_view(
            Path(tmp), budget.steps, dist.get_rank(), engine, budget, world_size, request_save=asks.request_save
        )
        step = Step(view.ctx, opt, engine, optimizer, iter(batches), SpikeGuard(SpikesConfig()))
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
