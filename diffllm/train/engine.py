"""The DeepSpeed side: its config generated from ours (with the ZeRO knobs for the model's scale, train/zero.py), and
the model built and wrapped (ZeRO, checkpointing, compile)."""

from __future__ import annotations

import copy
import functools
from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint

from ..model import DecoderLM, ModelConfig
from .config import Budget, OptimConfig, TrainerConfig
from .dist import on_gpu, rank
from .optim import UpdateGate, build_optimizer
from .zero import zero_knobs


def resolve_precision(trainer: TrainerConfig) -> str:
    """auto -> bf16 on GPUs, fp32 on CPUs (bf16 matmuls are 4-10x slower than fp32 on AVX2 CPUs)."""
    if trainer.precision != "auto":
        return trainer.precision
    return "bf16" if on_gpu() else "fp32"


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def deepspeed_config(
    trainer: TrainerConfig,
    opt: OptimConfig,
    budget: Budget,
    precision: str,
    load_universal: bool = False,
    d_model: Optional[int] = None,
) -> dict:
    """Our config -> DeepSpeed's. With `d_model`, the ZeRO knobs for that width (zero.py; build_engine fills them in
    from the model otherwise). `trainer.deepspeed` (raw DeepSpeed keys) is merged over the result, last."""
    zero: dict = {"stage": trainer.zero_stage, **(zero_knobs(trainer.zero_stage, d_model) if d_model else {})}
    if trainer.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu()}
    if trainer.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": on_gpu()}
    cfg = {
        "train_batch_size": budget.sequences_per_step,
        "train_micro_batch_size_per_gpu": budget.micro_batch_size,
        "gradient_accumulation_steps": budget.grad_accum,
        "gradient_clipping": opt.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,  # ours: torch AdamW (fused on CUDA) is not on DeepSpeed's list
        "zero_force_ds_cpu_optimizer": True,  # offload runs DeepSpeed's CPU Adam (optim.build_optimizer gives it)
        "checkpoint": {"load_universal": load_universal},
        "steps_per_print": 2**31 - 1,  # the trainer prints its own progress lines
        "wall_clock_breakdown": False,
    }
    return deep_merge(cfg, trainer.deepspeed)


def with_zero_knobs(ds_config: dict, d_model: int) -> dict:
    """`ds_config` with the ZeRO knobs for a model `d_model` wide filled in where it sets none (its own keys, those of
    trainer.deepspeed included, win)."""
    return deep_merge({"zero_optimization": zero_knobs(ds_config["zero_optimization"]["stage"], d_model)}, ds_config)


def apply_activation_checkpointing(model: DecoderLM) -> None:
    """Recompute each block in the backward pass. The forward is swapped on the instance, so parameter names (and
    hence checkpoints and zero_to_fp32 output) stay those of DecoderLM."""
    for block in model.layers:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def build_model(cfg: ModelConfig, ds_config: dict, seed: int, weights: Optional[dict] = None) -> DecoderLM:
    """DecoderLM initialised from `seed`, or holding `weights` (model.init_from). Under ZeRO-3 the parameters are
    created already partitioned (deepspeed.zero.Init); the init (or the load) is then applied with the parameters
    gathered, from rank 0."""
    import deepspeed

    torch.manual_seed(seed)
    stage3 = ds_config["zero_optimization"]["stage"] == 3
    with deepspeed.zero.Init(config_dict_or_path=ds_config, enabled=stage3):
        model = DecoderLM(cfg)
    if stage3:  # zero.Init partitioned each submodule before DecoderLM.reset_parameters ran: redo it, gathered
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            if rank() == 0:
                model.reset_parameters() if weights is None else model.load_state_dict(weights, strict=True)
    elif weights is not None:
        model.load_state_dict(weights, strict=True)
    return model


def build_engine(
    cfg: ModelConfig,
    trainer: TrainerConfig,
    opt: OptimConfig,
    ds_config: dict,
    seed: int,
    gate: UpdateGate,
    weights: Optional[dict] = None,
):
    """(engine, optimizer): the DeepSpeed engine around DecoderLM and our optimizer underneath it (torch AdamW, fused
    on CUDA; DeepSpeed's CPU Adam under trainer.offload_optimizer), which asks `gate` whether to drop each update.
    `ds_config` runs with the ZeRO knobs of the model's width (with_zero_knobs). trainer.compile: the whole DecoderLM,
    its loss head included, compiled as one graph by DeepSpeed's `engine.compile()` (inductor; under ZeRO-3
    DeepSpeed's parameter hooks break the graph per module unless trainer.deepspeed sets compile.deepcompile on CUDA:
    docs/training.md "At scale")."""
    import deepspeed

    ds_config = with_zero_knobs(ds_config, cfg.d_model)
    model = build_model(cfg, ds_config, seed, weights)
    if trainer.activation_checkpointing:
        apply_activation_checkpointing(model)
    optimizer = build_optimizer(model, opt, gate, cuda=on_gpu(), offload=trainer.offload_optimizer)
    # bf16 without ZeRO wraps the optimizer in DeepSpeed's FP16_UnfusedOptimizer, whose constructor runs one step
    # with zero gradients to create the optimizer state: AdamW would count it (its bias correction then lags, the
    # first real update being 0.735x an fp32 run's) and apply weight decay once. That step is skipped.
    with gate.closed():
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    if trainer.compile:
        engine.compile()  # DecoderLM.compile(backend=the accelerator's: inductor), after ZeRO's hooks are in place
    return engine, optimizer
