"""The resource planner: per-GPU memory under ZeRO 0-3 (weights, gradients, optimizer states, DeepSpeed's buckets for
the knobs the trainer sets, activations with the loss head, the diagnostics level's transients) with and without
activation checkpointing and offload, the largest micro-batch that fits, the setting it would pick, and the time to a
token budget.

Model states follow DeepSpeed's own accounting for bf16 mixed precision with Adam (the comment in
`estimate_zero2_model_states_mem_needs`): per parameter 2 B bf16 weights, 2 B bf16 + 4 B fp32 gradients, 4 B fp32
master weights and 8 B Adam moments. ZeRO-1 shards the last 16 B, ZeRO-2 also the bf16 gradients, ZeRO-3 everything
and adds a gather buffer of 4 B x the largest layer. DeepSpeed's ZeRO-3 estimate leaves out the bf16 weight shard
(2 B / #GPUs); the planner adds it on its own line (`zero3 weight shard`) rather than hide it in a total."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Iterable

from ..counts import parse_count
from ..errors import UserError
from ..hardware import GPU, lookup
from ..model.accounting import meta_model, model_stats
from ..model.config import ModelConfig
from ..model.presets import check_model_overrides
from ..train.zero import BucketBytes, bucket_bytes, merged_knobs
from .activations import ActivationBytes, activation_bytes, logit_recompute_bytes
from .config import PLAN, PlanConfig

__all__ = ["PlanConfig", "make_plan", "render", "plan_dict", "pick", "setting"]

GiB = 2**30


@dataclass(frozen=True)
class ModelStates:
    """Bytes per GPU for one ZeRO setting (offload moves the rest to host memory)."""

    weights: float
    gradients: float
    optimizer: float
    gather_buffer: float  # ZeRO-3: 4 B x the largest layer (DeepSpeed's allowance for gathered weights)
    zero3_weight_shard: float  # ZeRO-3 without param offload: the bf16 shard DeepSpeed's estimate leaves out
    cpu_per_node: float  # host memory per node with offload (DeepSpeed's formula, incl. its 1.5 buffer factor)

    @property
    def deepspeed_gpu(self) -> float:
        """The figure DeepSpeed's estimators print per GPU."""
        return self.weights + self.gradients + self.optimizer + self.gather_buffer

    @property
    def gpu(self) -> float:
        return self.deepspeed_gpu + self.zero3_weight_shard


def model_states(
    psi: int, largest_layer: int, stage: int, gpus_per_node: int, nodes: int, offload: bool, buffer_factor: float = 1.5
) -> ModelStates:
    """Per-GPU bytes of the model states of `psi` parameters under ZeRO `stage` on nodes x gpus_per_node GPUs."""
    n = gpus_per_node * nodes
    if offload and stage < 2:
        raise UserError(f"offload with zero_stage={stage}: the planner models offload for ZeRO-2 and -3 only")
    if stage == 3:
        gather = 4.0 * largest_layer
        if offload:  # params and optimizer on the CPU (DeepSpeed: offload_param=cpu, offload_optimizer=cpu, zero_init)
            return ModelStates(0, 0, 0, gather, 0, psi * 18 / nodes * buffer_factor)
        return ModelStates(
            0, 6.0 * psi / n, 12.0 * psi / n, gather, 2.0 * psi / n, largest_layer * 4 * gpus_per_node * buffer_factor
        )
    if offload:  # ZeRO-2 + offload_optimizer=cpu: only the bf16 weights stay on the GPU
        return ModelStates(2.0 * psi, 0, 0, 0, 0, psi * max(4 * n, 16) * buffer_factor)
    grads = 6.0 * psi / n if stage == 2 else (2.0 * psi + 4.0 * psi / n if stage == 1 else 6.0 * psi)
    optim = 12.0 * psi / n if stage >= 1 else 12.0 * psi
    return ModelStates(2.0 * psi, grads, optim, 0, 0, psi * 4 * gpus_per_node * buffer_factor)


def largest_layer_params(cfg: ModelConfig) -> int:
    """DeepSpeed's `largest_layer_params`: the most parameters held directly by one module."""
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in meta_model(cfg).modules())


@dataclass(frozen=True)
class Sizes:
    """What the planner reads off the meta model beside its parameter count."""

    largest_layer: int  # DeepSpeed's largest_layer_params
    largest_block_param: int  # the largest tensor of a block (the full diagnostics gather its full fp32 gradient)
    numels: tuple[int, ...]  # every parameter's size (ZeRO-3 keeps those below its persistence threshold whole)


def _cached(fn):
    """fn(cfg, *args) remembered by the config's value (a meta model of a paper size takes a second to build)."""
    seen: dict = {}

    @functools.wraps(fn)
    def get(cfg: ModelConfig, *args):
        key = (repr(cfg), args)
        if key not in seen:
            seen[key] = fn(cfg, *args)
        return seen[key]

    return get


@_cached
def model_sizes(cfg: ModelConfig) -> Sizes:
    model = meta_model(cfg)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    block = max(p.numel() for p in model.layers.parameters())
    return Sizes(largest, block, tuple(p.numel() for p in model.parameters()))


@dataclass(frozen=True)
class Row:
    stage: int
    checkpointing: bool
    offload: bool
    states: ModelStates
    activations_per_sample: float  # blocks and loss head at micro-batch 1
    micro_batch: int  # the chosen (or largest fitting) micro-batch; 0 = nothing fits
    total: float  # per GPU at micro_batch (when nothing fits: at the micro-batch asked for, or at 1)
    grad_accum: int
    buckets: BucketBytes = BucketBytes(0.0, 0.0, 0.0, 0.0)  # DeepSpeed's communication buffers at the trainer's knobs
    knobs: dict = dataclasses.field(default_factory=dict)  # the zero_optimization keys the trainer would run with
    activations: float = 0.0  # blocks + loss head at the micro-batch of `total`
    diagnostics: float = 0.0  # what the diagnostics level adds at a logged step
    tried: int = 1  # the micro-batch `total` is at

    @property
    def fits(self) -> bool:
        return self.micro_batch > 0


@dataclass(frozen=True)
class Plan:
    cfg: ModelConfig
    plan: PlanConfig
    gpu: GPU
    seq_len: int
    total_params: int
    nonembedding_params: int
    flops_per_token: float
    tokens: int
    global_batch_tokens: int
    samples_per_gpu: int  # sequences per GPU per optimizer step
    rows: list[Row]
    kv_bytes_per_token: int = 0  # the KV cache of one token, all layers, bf16 (the variant's declaration)
    act: ActivationBytes | None = None
    logits_bytes: float = 0.0  # full diagnostics: the attention-logit recompute of one sequence
    gather_bytes: float = 0.0  # full diagnostics: one block tensor's full fp32 gradient and its square

    @property
    def context(self) -> int:
        """Inference: tokens per sequence the KV cache holds (plan's context=, else the training seq_len)."""
        return self.plan.context or self.seq_len

    @property
    def kv_cache_bytes(self) -> float:
        """Inference: the KV cache of `batch` sequences of `context` tokens."""
        return float(self.kv_bytes_per_token) * self.context * self.plan.batch

    @property
    def inference_bytes(self) -> float:
        """Inference on one device, no sharding: bf16 weights + the KV cache (activations of a decode step are
        small beside them and not counted)."""
        return 2.0 * self.total_params + self.kv_cache_bytes

    @property
    def world(self) -> int:
        return self.plan.nodes * self.plan.gpus_per_node

    @property
    def total_flops(self) -> float:
        return self.flops_per_token * self.tokens

    @property
    def seconds(self) -> float:
        return self.total_flops / (self.world * self.gpu.bf16_tflops * 1e12 * self.plan.mfu)

    @property
    def budget_bytes(self) -> float:
        return self.gpu.memory_gib * GiB * self.plan.usable_fraction

    @property
    def fitting(self) -> list[Row]:
        return [r for r in self.rows if r.fits]


def activations(act: ActivationBytes, n_layers: int, seq_len: int, checkpointing: bool, mb: int) -> float:
    """Peak activation bytes of a micro-batch of `mb` sequences: every block's saved tensors, then the loss head's
    peak on top; with full activation checkpointing every block's input, plus the larger of the head's peak and one
    block recomputed in backward (the head's backward is over before the first block recomputes)."""
    tokens = mb * seq_len
    if checkpointing:
        return tokens * n_layers * act.block_input + max(act.head(mb), tokens * act.block)
    return tokens * n_layers * act.block + act.head(mb)


def activations_per_sample(act: ActivationBytes, n_layers: int, seq_len: int, checkpointing: bool) -> float:
    return activations(act, n_layers, seq_len, checkpointing, 1)


def _row(pc: PlanConfig, p: Plan, sizes: Sizes, stage: int, ckpt: bool, offload: bool) -> Row:
    cfg, act = p.cfg, p.act
    states = model_states(p.total_params, sizes.largest_layer, stage, pc.gpus_per_node, pc.nodes, offload)
    knobs = merged_knobs(stage, cfg.d_model, pc.deepspeed)
    small = sum(n for n in sizes.numels if n <= knobs.get("stage3_param_persistence_threshold", 10**5))
    buckets = bucket_bytes(stage, knobs, p.total_params, sizes.largest_layer, small if stage == 3 else 0)
    logits = p.logits_bytes if pc.diagnostics == "full" and stage < 3 else 0.0  # not recomputed under ZeRO-3
    gather = p.gather_bytes if pc.diagnostics == "full" else 0.0

    def at(mb: int) -> tuple[float, float, float]:  # (total, activations, diagnostics)
        acts = activations(act, cfg.n_layers, p.seq_len, ckpt, mb)
        diag = max(acts + logits, gather) - acts  # logits mid-forward; the gather after backward, activations gone
        return states.gpu + buckets.total + acts + diag, acts, diag

    if pc.micro_batch_size:  # the micro-batch asked for
        tried = pc.micro_batch_size
        mb = tried if at(tried)[0] <= p.budget_bytes else 0
    else:  # the largest micro-batch that fits and divides the per-GPU batch (whole accumulation steps)
        divisors = [m for m in range(p.samples_per_gpu, 0, -1) if p.samples_per_gpu % m == 0]
        mb = next((m for m in divisors if at(m)[0] <= p.budget_bytes), 0)
        tried = max(mb, 1)
    total, acts, diag = at(tried)
    return Row(
        stage,
        ckpt,
        offload,
        states,
        activations_per_sample(act, cfg.n_layers, p.seq_len, ckpt),
        mb,
        total,
        p.samples_per_gpu // mb if mb else 0,
        buckets,
        knobs,
        acts,
        diag,
        tried,
    )


def _rows(pc: PlanConfig, p: Plan, sizes: Sizes) -> list[Row]:
    stages = [pc.zero_stage] if pc.zero_stage is not None else [0, 1, 2, 3]
    ckpts = [pc.activation_checkpointing] if pc.activation_checkpointing is not None else [False, True]
    offloads = [pc.offload] if pc.offload is not None else [False, True]
    return [_row(pc, p, sizes, s, c, o) for s in stages for o in offloads for c in ckpts if not (o and s < 2)]


def pick(rows: list[Row]) -> Row | None:
    """The setting the planner would train with: the cheapest that fits. No offload before offload; ZeRO-0-2 before
    ZeRO-3 (which gathers the weights in every forward and backward, 1.5x the traffic, through per-module hooks that
    also break a compiled graph at every module); no activation checkpointing before checkpointing (a third more
    compute); then ZeRO-1, -2, -0 (ZeRO-1 shards the optimizer at ZeRO-0's traffic; ZeRO-2 also the gradients but
    reduces every micro-batch; DeepSpeed's bf16 without ZeRO steps an unfused optimizer); the largest micro-batch."""
    order = {1: 0, 2: 1, 0: 2, 3: 3}
    return min(
        (r for r in rows if r.fits),
        key=lambda r: (r.offload, r.stage == 3, r.checkpointing, order[r.stage], -r.micro_batch),
        default=None,
    )


def setting(row: Row, prefix: str = "") -> str:
    """A row's choices as keys: `zero_stage=2 activation_checkpointing=false micro_batch_size=4` (prefix "trainer."
    names the trainer's own keys, and offload as trainer.offload_optimizer / offload_params)."""
    keys = [f"{prefix}zero_stage={row.stage}", f"{prefix}activation_checkpointing={str(row.checkpointing).lower()}"]
    if row.offload:
        keys += [f"{prefix}offload_optimizer=true"] if prefix else ["offload=true"]
        keys += [f"{prefix}offload_params=true"] if prefix and row.stage == 3 else []
    return " ".join(keys + [f"{prefix}micro_batch_size={row.micro_batch or row.tried}"])


def _gib(x: float) -> str:
    return f"{x / GiB:.1f}"


def need(row: Row, prefix: str = "") -> str:
    """`needs 84.2 GiB per GPU (model states 57.0 + buckets 0.2 + activations 26.7 + diagnostics 0.3) at <setting>`."""
    return (
        f"needs {_gib(row.total)} GiB per GPU (model states {_gib(row.states.gpu)} + buckets {_gib(row.buckets.total)}"
        f" + activations {_gib(row.activations)} + diagnostics {_gib(row.diagnostics)}) at {setting(row, prefix)}"
    )


_stats = _cached(model_stats)
_activation_bytes = _cached(activation_bytes)
_logit_recompute_bytes = _cached(logit_recompute_bytes)


def make_plan(cfg: ModelConfig, pc: PlanConfig, prefix: str = "") -> Plan:
    """The plan of `cfg` under `pc`; a one-line UserError when none of its rows fits, naming what each needs and the
    setting that would fit (as keys with `prefix`: "" for plan's own, "trainer." for the trainer's)."""
    pc.validate()
    gpu = lookup(pc.gpu)
    seq_len = pc.seq_len or cfg.max_seq_len
    stats = _stats(cfg, seq_len)
    tokens = parse_count(pc.tokens, "tokens")
    batch = parse_count(pc.global_batch_tokens, "global_batch_tokens")
    world = pc.nodes * pc.gpus_per_node
    if batch % (seq_len * world):
        raise UserError(
            f"global_batch_tokens={batch}: not a whole number of {seq_len}-token sequences per GPU on {world} GPUs "
            f"(use a multiple of {seq_len * world})"
        )
    samples_per_gpu = batch // (seq_len * world)
    if pc.micro_batch_size and samples_per_gpu % pc.micro_batch_size:
        raise UserError(
            f"micro_batch_size={pc.micro_batch_size}: does not divide the {samples_per_gpu} sequences per GPU per step "
            f"({batch} tokens on {world} GPUs)"
        )
    sizes = model_sizes(cfg)
    plan = Plan(
        cfg,
        pc,
        gpu,
        seq_len,
        stats.total_params,
        stats.nonembedding_params,
        stats.flops_per_token,
        tokens,
        batch,
        samples_per_gpu,
        [],
        stats.kv_bytes_per_token,
        _activation_bytes(cfg, seq_len),
        _logit_recompute_bytes(cfg, seq_len) if pc.diagnostics == "full" else 0.0,
        8.0 * sizes.largest_block_param if pc.diagnostics == "full" else 0.0,
    )
    rows = _rows(pc, plan, sizes)
    if not rows:
        raise UserError(f"offload=true with zero_stage={pc.zero_stage}: offload needs ZeRO-2 or -3")
    plan = dataclasses.replace(plan, rows=rows)
    if not plan.fitting:
        free = _rows(
            dataclasses.replace(
                pc, zero_stage=None, activation_checkpointing=None, offload=None, micro_batch_size=None
            ),
            plan,
            sizes,
        )
        offer = (
            f"{pc.nodes}x{pc.gpus_per_node} {gpu.name} offer {_gib(plan.budget_bytes)} GiB each "
            f"({pc.usable_fraction:.0%} of {gpu.memory_gib:g})"
        )
        fit = pick(free)
        if fit is not None:
            asked = min(rows, key=lambda r: r.total)
            raise UserError(f"does not fit: {cfg.name} {need(asked, prefix)}; {offer}; fits: {setting(fit, prefix)}")
        least = min(free, key=lambda r: r.total)
        raise UserError(
            f"cluster too small: {cfg.name} {need(least, prefix)}, the least of any setting; {offer}; use more or "
            "larger GPUs"
        )
    return plan


def _duration(seconds: float) -> str:
    days, rest = divmod(seconds, 86400)
    return f"{int(days)}d {rest / 3600:.1f}h" if days else f"{seconds / 3600:.2f}h"


def _knob_line(rows: list[Row]) -> list[str]:
    """One `deepspeed` line per ZeRO family in the rows: the zero_optimization keys and the buckets they cost."""
    lines = []
    for label, stages in (("ZeRO-1/2", (1, 2)), ("ZeRO-3", (3,))):
        row = next((r for r in rows if r.stage in stages), None)
        if row is None:
            continue
        keys = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in row.knobs.items())
        b = row.buckets
        cost = f"buckets {b.reduce / GiB:.2f} GiB" + (
            f", live parameters {b.live_params / GiB:.2f} GiB, persistent {b.persistent / GiB:.2f} GiB"
            if 3 in stages
            else ""
        )
        lines.append(f"deepspeed    {label}: {keys} ({cost})")
    return lines


def render(p: Plan) -> str:
    pc, act = p.plan, p.act
    diag = (
        f"full: +{max(p.logits_bytes, p.gather_bytes) / GiB:.2f} GiB at a logged step at most (fp32 attention logits "
        f"of one sequence {p.logits_bytes / GiB:.2f} GiB, not under ZeRO-3; a block tensor's full fp32 gradient "
        f"{p.gather_bytes / GiB:.2f} GiB)"
        if pc.diagnostics == "full"
        else f"{pc.diagnostics}: nothing beside the step"
    )
    chosen = pick(p.rows)
    lines = [
        f"model        {p.cfg.name} ({p.cfg.arch}): {p.total_params:,} params ({p.nonembedding_params:,} "
        "non-embedding)",
        f"cluster      {pc.nodes} x {pc.gpus_per_node} {p.gpu.name} = {p.world} GPUs, {p.gpu.memory_gib:g} GiB "
        f"({pc.usable_fraction:.0%} usable), {p.gpu.bf16_tflops:g} TFLOP/s dense bf16 each",
        f"batch        {p.global_batch_tokens:,} tokens = {p.samples_per_gpu} x {p.seq_len} tokens per GPU per step",
        f"budget       {p.tokens:,} tokens x {p.flops_per_token:.4g} FLOPs/token = {p.total_flops:.3g} FLOPs",
        f"time         {_duration(p.seconds)} at {pc.mfu:.0%} MFU "
        f"({p.tokens / p.seconds / p.world:,.0f} tokens/s per GPU)",
        f"inference    {p.inference_bytes / GiB:.2f} GiB on one GPU = bf16 weights "
        f"{2 * p.total_params / GiB:.2f} GiB + KV cache {p.kv_cache_bytes / GiB:.2f} GiB "
        f"({p.kv_bytes_per_token:,} B/token x {p.context:,} context x {pc.batch} batch)",
        f"loss head    {act.head(1) / GiB:.2f} GiB at its peak for one sequence, "
        f"+{act.head_per_sequence / GiB:.2f} GiB per more (head_loss forward + backward, measured; "
        f"{act.head_saved * p.seq_len / GiB:.2f} GiB saved)",
        f"diagnostics  {diag}",
        *_knob_line(p.rows),
        ("fits         " if len(p.rows) == 1 else "pick         ")
        + (f"{setting(chosen)} ({chosen.total / GiB:.1f} of {p.budget_bytes / GiB:.1f} GiB)" if chosen else "-"),
        "",
        "| ZeRO | act. ckpt | offload | weights | grads | optimizer | zero-3 extra | buckets | activations / sample | "
        "max micro-batch | grad accum | total / GPU | host / node |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in p.rows:
        s = r.states
        lines.append(
            f"| {r.stage} | {'yes' if r.checkpointing else 'no'} | {'yes' if r.offload else 'no'} | "
            f"{(s.weights + s.zero3_weight_shard) / GiB:.2f} | {s.gradients / GiB:.2f} | {s.optimizer / GiB:.2f} | "
            f"{s.gather_buffer / GiB:.2f} | {r.buckets.total / GiB:.2f} | {r.activations_per_sample / GiB:.2f} | "
            f"{r.micro_batch or 'does not fit'} | {r.grad_accum or '-'} | {r.total / GiB:.2f} | "
            f"{s.cpu_per_node / GiB:.0f} |"
        )
    lines.append(
        "(GiB per GPU; total at the micro-batch shown (when nothing fits: at the one asked for, or 1), with the "
        "diagnostics level's transient; activations / sample: blocks and loss head at micro-batch 1)"
    )
    return "\n".join(lines)


def plan_dict(p: Plan) -> dict:
    """The plan as plain data (for --json style output and tests)."""
    chosen = pick(p.rows)
    return {
        "model": p.cfg.name,
        "world": p.world,
        "gpu": p.gpu.name,
        "seconds": p.seconds,
        "total_flops": p.total_flops,
        "rows": [dataclasses.asdict(r) for r in p.rows],
        "pick": setting(chosen) if chosen else None,
        "inference": {
            "kv_bytes_per_token": p.kv_bytes_per_token,
            "context": p.context,
            "batch": p.plan.batch,
            "kv_cache_bytes": p.kv_cache_bytes,
            "total_bytes": p.inference_bytes,
        },
    }


# plan's keys that a `trainer=<preset>` fills from the preset's own (plan key -> trainer key)
TRAINER_KEYS = {
    "global_batch_tokens": "global_batch_tokens",
    "tokens": "tokens",
    "zero_stage": "zero_stage",
    "activation_checkpointing": "activation_checkpointing",
    "offload": "offload_optimizer",
    "micro_batch_size": "micro_batch_size",
    "diagnostics": "diagnostics",
    "deepspeed": "deepspeed",
}


def plan_config(cfg, given: Iterable[str] = ()) -> tuple[ModelConfig, PlanConfig]:
    """The model and the PlanConfig of a composed configs/plan.yaml. With a `trainer=<preset>`, the preset's settings
    (TRAINER_KEYS) replace plan's defaults, except the keys `given` on the command line."""
    from omegaconf import OmegaConf

    from ..config import build

    raw = OmegaConf.to_container(cfg, resolve=True)
    keys = {k: v for k, v in raw.items() if k not in ("model", "gpus", "trainer")}
    if raw.get("trainer"):
        keys.update({k: raw["trainer"][t] for k, t in TRAINER_KEYS.items() if k not in set(given)})
    return build(ModelConfig, cfg.model, "model"), build(PlanConfig, keys, "plan")


def main() -> None:
    """`diffllm plan model=<preset> nodes=N gpus_per_node=G gpu=h100 tokens=1T ...` (configs/plan.yaml)."""
    import sys

    from ..config import hydra_app
    from ..hardware import gpu_table

    argv = sys.argv[1:]
    check_model_overrides(argv, "diffllm plan")

    @hydra_app("plan", PLAN)
    def app(cfg, typed: dict) -> None:
        if cfg.get("gpus"):
            print(gpu_table())
            return
        given = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a}
        print(render(make_plan(*plan_config(cfg, given))))

    app()
