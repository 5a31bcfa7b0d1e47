"""The resource planner: per-GPU memory under ZeRO 0-3 (weights, gradients, optimizer states, activations) with and
without activation checkpointing and offload, the largest micro-batch that fits, and the time to a token budget.

Model states follow DeepSpeed's own accounting for bf16 mixed precision with Adam (the comment in
`estimate_zero2_model_states_mem_needs`): per parameter 2 B bf16 weights, 2 B bf16 + 4 B fp32 gradients, 4 B fp32
master weights and 8 B Adam moments. ZeRO-1 shards the last 16 B, ZeRO-2 also the bf16 gradients, ZeRO-3 everything
and adds a gather buffer of 4 B x the largest layer. DeepSpeed's ZeRO-3 estimate leaves out the bf16 weight shard
(2 B / #GPUs); the planner adds it on its own line (`zero3 weight shard`) rather than hide it in a total."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..counts import parse_count
from ..errors import UserError
from ..hardware import GPU, lookup
from ..model.accounting import meta_model, model_stats
from ..model.config import ModelConfig
from ..model.presets import check_model_overrides
from .activations import ActivationBytes, activation_bytes
from .config import PlanConfig

__all__ = ["PlanConfig", "make_plan", "render", "plan_dict"]

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
class Row:
    stage: int
    checkpointing: bool
    offload: bool
    states: ModelStates
    activations_per_sample: float
    micro_batch: int  # the chosen (or largest fitting) micro-batch; 0 = nothing fits
    total: float  # per GPU at micro_batch (at 1 when nothing fits)
    grad_accum: int


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
    def fitting(self) -> list[Row]:
        return [r for r in self.rows if r.micro_batch > 0]


def activations_per_sample(act: ActivationBytes, n_layers: int, seq_len: int, checkpointing: bool) -> float:
    """Peak activation bytes for one sequence: every block's saved tensors, or with full activation checkpointing
    every block's input plus one block recomputed during backward; then the output head."""
    blocks = n_layers * act.block_input + act.block if checkpointing else n_layers * act.block
    return seq_len * (blocks + act.head + act.logits_transient)


def _row(
    pc: PlanConfig,
    cfg: ModelConfig,
    act: ActivationBytes,
    psi: int,
    largest: int,
    seq_len: int,
    samples_per_gpu: int,
    budget: float,
    stage: int,
    ckpt: bool,
    offload: bool,
) -> Row:
    states = model_states(psi, largest, stage, pc.gpus_per_node, pc.nodes, offload)
    per_sample = activations_per_sample(act, cfg.n_layers, seq_len, ckpt)
    if pc.micro_batch_size:
        mb = pc.micro_batch_size if states.gpu + pc.micro_batch_size * per_sample <= budget else 0
    else:  # the largest micro-batch that fits and divides the per-GPU batch (whole accumulation steps)
        fits = int(max(0.0, budget - states.gpu) // per_sample)
        mb = max((m for m in range(1, min(fits, samples_per_gpu) + 1) if samples_per_gpu % m == 0), default=0)
    total = states.gpu + max(mb, 1) * per_sample
    return Row(stage, ckpt, offload, states, per_sample, mb, total, samples_per_gpu // mb if mb else 0)


def make_plan(cfg: ModelConfig, pc: PlanConfig) -> Plan:
    pc.validate()
    gpu = lookup(pc.gpu)
    seq_len = pc.seq_len or cfg.max_seq_len
    stats = model_stats(cfg, seq_len)
    tokens = parse_count(pc.tokens, "tokens")
    batch = parse_count(pc.global_batch_tokens, "global_batch_tokens")
    world = pc.nodes * pc.gpus_per_node
    if batch % (seq_len * world):
        raise UserError(
            f"global_batch_tokens={batch}: not a whole number of {seq_len}-token sequences per GPU on {world} GPUs "
            f"(use a multiple of {seq_len * world})"
        )
    samples_per_gpu = batch // (seq_len * world)
    act = activation_bytes(cfg, seq_len)
    largest = largest_layer_params(cfg)
    budget = gpu.memory_gib * GiB * pc.usable_fraction
    stages = [pc.zero_stage] if pc.zero_stage is not None else [0, 1, 2, 3]
    ckpts = [pc.activation_checkpointing] if pc.activation_checkpointing is not None else [False, True]
    offloads = [pc.offload] if pc.offload is not None else [False, True]
    rows = [
        _row(pc, cfg, act, stats.total_params, largest, seq_len, samples_per_gpu, budget, s, c, o)
        for s in stages
        for o in offloads
        for c in ckpts
        if not (o and s < 2)
    ]
    if not rows:
        raise UserError(f"offload=true with zero_stage={pc.zero_stage}: offload needs ZeRO-2 or -3")
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
        rows,
        stats.kv_bytes_per_token,
    )
    if not plan.fitting:
        best = min(rows, key=lambda r: r.total)
        raise UserError(
            f"cluster too small: {cfg.name} needs {best.total / GiB:.1f} GiB per GPU even with ZeRO-{best.stage}"
            f"{' + offload' if best.offload else ''}{' + activation checkpointing' if best.checkpointing else ''} at "
            f"micro_batch_size={max(best.micro_batch, 1)} (model states {best.states.gpu / GiB:.1f} GiB), but "
            f"{pc.nodes}x{pc.gpus_per_node} {gpu.name} offer {budget / GiB:.1f} GiB each "
            f"({pc.usable_fraction:.0%} of {gpu.memory_gib:g}); use more or larger GPUs"
        )
    return plan


def _duration(seconds: float) -> str:
    days, rest = divmod(seconds, 86400)
    return f"{int(days)}d {rest / 3600:.1f}h" if days else f"{seconds / 3600:.2f}h"


def render(p: Plan) -> str:
    pc = p.plan
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
        "",
        "| ZeRO | act. ckpt | offload | weights | grads | optimizer | zero-3 extra | activations / sample | "
        "max micro-batch | grad accum | total / GPU | host / node |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in p.rows:
        s = r.states
        lines.append(
            f"| {r.stage} | {'yes' if r.checkpointing else 'no'} | {'yes' if r.offload else 'no'} | "
            f"{(s.weights + s.zero3_weight_shard) / GiB:.2f} | {s.gradients / GiB:.2f} | {s.optimizer / GiB:.2f} | "
            f"{s.gather_buffer / GiB:.2f} | {r.activations_per_sample / GiB:.2f} | "
            f"{r.micro_batch or 'does not fit'} | {r.grad_accum or '-'} | {r.total / GiB:.2f} | "
            f"{s.cpu_per_node / GiB:.0f} |"
        )
    lines.append("(GiB per GPU; total at the micro-batch shown, or at 1 when nothing fits)")
    return "\n".join(lines)


def plan_dict(p: Plan) -> dict:
    """The plan as plain data (for --json style output and tests)."""
    return {
        "model": p.cfg.name,
        "world": p.world,
        "gpu": p.gpu.name,
        "seconds": p.seconds,
        "total_flops": p.total_flops,
        "rows": [dataclasses.asdict(r) for r in p.rows],
        "inference": {
            "kv_bytes_per_token": p.kv_bytes_per_token,
            "context": p.context,
            "batch": p.plan.batch,
            "kv_cache_bytes": p.kv_cache_bytes,
            "total_bytes": p.inference_bytes,
        },
    }


def main() -> None:
    """`diffllm plan model=<preset> nodes=N gpus_per_node=G gpu=h100 tokens=1T ...` (configs/plan.yaml)."""
    import sys

    from omegaconf import OmegaConf

    from ..config import build, hydra_app
    from ..hardware import gpu_table

    check_model_overrides(sys.argv[1:], "diffllm plan")

    @hydra_app("plan")
    def app(cfg) -> None:
        if cfg.get("gpus"):
            print(gpu_table())
            return
        model = build(ModelConfig, cfg.model, "model")
        keys = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in ("model", "gpus")}
        print(render(make_plan(model, build(PlanConfig, keys, "plan"))))

    app()
