"""The planner against independent references: DeepSpeed's own memory estimators, autograd's saved tensors on a real
CPU forward, and hand arithmetic for FLOPs and time."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import re
import subprocess
import sys
import time

import pytest
import torch

from diffllm.model import variants
from diffllm.model.accounting import meta_model
from diffllm.model.layers import rotary_cos_sin
from diffllm.model.presets import load_preset
from diffllm.model.transformer import Block
from diffllm.scaling.activations import activation_bytes
from diffllm.scaling.planner import GiB, PlanConfig, largest_layer_params, make_plan, model_states, render

ds12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
ds3 = pytest.importorskip("deepspeed.runtime.zero.stage3")


def _printed_gpu_gib(fn, *args, **kw) -> dict[str, float]:
    """Run one of DeepSpeed's *_all_cold estimators and read its printed table: options -> per-GPU GiB."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args, **kw)
    rows = re.findall(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$", out.getvalue(), flags=re.M)
    assert rows, out.getvalue()
    return {re.sub(r"\s+|OffloadDeviceEnum\.", "", opts): float(gpu) for _, gpu, opts in rows}


CLUSTERS = [(1, 1), (1, 8), (8, 8), (64, 8)]


@functools.cache
def _sizes(preset: str) -> tuple[int, int, tuple[int, int]]:
    """(total params, our largest layer, DeepSpeed's (total, largest layer)) of a preset, built once on meta."""
    model = meta_model(load_preset(preset))
    return (
        sum(p.numel() for p in model.parameters()),
        largest_layer_params(load_preset(preset)),
        ds3.model_to_params(model),
    )


@pytest.mark.parametrize("preset", ["diff-830m", "transformer-6.8b", "diff-13.1b"])
@pytest.mark.parametrize("nodes,gpn", CLUSTERS)
def test_zero2_model_states_match_deepspeed(preset, nodes, gpn):
    psi = _sizes(preset)[0]
    printed = _printed_gpu_gib(ds12.estimate_zero2_model_states_mem_needs_all_cold, psi, gpn, nodes)
    ours = model_states(psi, 0, 2, gpn, nodes, offload=False).deepspeed_gpu / GiB
    ours_off = model_states(psi, 0, 2, gpn, nodes, offload=True).deepspeed_gpu / GiB
    assert ours == pytest.approx(printed["offload_optimizer=none"], rel=0.05, abs=0.01)
    assert ours_off == pytest.approx(printed["offload_optimizer=cpu"], rel=0.05, abs=0.01)


@pytest.mark.parametrize("preset", ["diff-830m", "transformer-6.8b", "diff-13.1b"])
@pytest.mark.parametrize("nodes,gpn", CLUSTERS)
def test_zero3_model_states_match_deepspeed(preset, nodes, gpn):
    psi, largest, ds_sizes = _sizes(preset)
    assert largest == ds_sizes[1]  # DeepSpeed's own largest layer on the same meta model (its total dedupes by
    # data_ptr, which is 0 for every meta tensor, so only the largest layer is comparable here)
    printed = _printed_gpu_gib(ds3.estimate_zero3_model_states_mem_needs_all_cold, psi, largest, gpn, nodes)
    none = model_states(psi, largest, 3, gpn, nodes, offload=False)
    full = model_states(psi, largest, 3, gpn, nodes, offload=True)
    assert none.deepspeed_gpu / GiB == pytest.approx(
        printed["offload_param=none,offload_optimizer=none,zero_init=1"], rel=0.05, abs=0.01
    )
    assert full.deepspeed_gpu / GiB == pytest.approx(
        printed["offload_param=cpu,offload_optimizer=cpu,zero_init=1"], rel=0.05, abs=0.01
    )
    assert none.gpu - none.deepspeed_gpu == pytest.approx(2 * psi / (nodes * gpn))  # the bf16 shard, shown apart


def _real_saved_bytes(cfg, seq_len: int) -> float:
    """Bytes per token autograd saves in one block on a real CPU forward in fp32, deduplicated by storage."""
    torch.manual_seed(0)
    block = Block(cfg, cfg.n_layers - 1)
    x = torch.randn(1, seq_len, cfg.d_model, requires_grad=True)
    cos, sin = rotary_cos_sin(seq_len, cfg.rotary_dim, cfg.rope_theta, x.device)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = block(x, cos, sin)
    y.sum().backward()  # the saved tensors really are enough for backward
    return sum(storages.values()) / seq_len


@pytest.mark.parametrize(
    "preset,backend", [("transformer-tiny", "sdpa")] + [(f"{a}-tiny", "eager") for a in variants()]
)
def test_block_activations_match_a_real_forward(preset, backend):
    """sdpa: CPU runs its flash kernel for the Transformer (same saved tensors as the planner's meta kernel); for
    the Diff variants CPU's sdpa falls back to the math path (Diff: v heads 2d wide), so every variant is checked
    with the eager maps on both sides."""
    cfg = dataclasses.replace(load_preset(preset), attn_backend=backend)
    measured = _real_saved_bytes(cfg, 256)
    planned = activation_bytes(cfg, 256, dtype=torch.float32).block
    assert planned == pytest.approx(measured, rel=0.02)


def test_checkpointing_and_more_gpus_help():
    cfg = load_preset("diff-6.8b")
    small = make_plan(cfg, PlanConfig(nodes=1, gpus_per_node=8, gpu="a100-80gb", zero_stage=3, offload=False))
    big = make_plan(cfg, PlanConfig(nodes=4, gpus_per_node=8, gpu="a100-80gb", zero_stage=3, offload=False))
    no_ckpt, ckpt = small.rows
    assert not no_ckpt.checkpointing and ckpt.checkpointing
    assert ckpt.activations_per_sample < no_ckpt.activations_per_sample / 3
    assert ckpt.micro_batch > no_ckpt.micro_batch
    sharded = [p.rows[0].states.gpu - p.rows[0].states.gather_buffer for p in (small, big)]
    assert sharded[1] == pytest.approx(sharded[0] / 4)  # 4x the GPUs: a quarter of the sharded model states
    for row in small.rows + big.rows:  # the chosen micro-batch fits and divides the per-GPU batch
        assert row.total <= 80 * GiB * 0.9 and small.samples_per_gpu % row.micro_batch == 0 or row.micro_batch == 0


def test_13b_on_64_h100_in_seconds_and_time_to_budget():
    start = time.perf_counter()
    p = make_plan(load_preset("diff-13.1b"), PlanConfig(nodes=8, gpus_per_node=8, gpu="h100", tokens="1T", mfu=0.4))
    assert time.perf_counter() - start < 10
    assert p.fitting
    hand = p.flops_per_token * 1e12 / (64 * 989e12 * 0.4)
    assert p.seconds == pytest.approx(hand)
    assert p.flops_per_token > 6 * 13e9  # at least 6 N per token


def test_cluster_too_small_says_why():
    with pytest.raises(ValueError, match=r"cluster too small: diff-13.1b needs .* GiB per GPU .* 1x1 a100-40gb"):
        make_plan(load_preset("diff-13.1b"), PlanConfig(nodes=1, gpus_per_node=1, gpu="a100-40gb", offload=False))


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("gpu", "h900", "gpu=h900: unknown GPU type"),
        ("global_batch_tokens", "1000", "global_batch_tokens=1000: not a whole number"),
        ("tokens", "lots", "tokens: expected a count like 20M, 1.5B or 4096, got 'lots'"),
        ("tokens", "-5B", "tokens: must be positive, got '-5B'"),
        ("tokens", "0", "tokens: must be positive"),
        ("global_batch_tokens", "1.5", "global_batch_tokens: '1.5' is not a whole number"),
    ],
)
def test_bad_plan_inputs(key, value, match):
    with pytest.raises(ValueError, match=match):
        make_plan(load_preset("diff-830m"), PlanConfig(**{key: value}))


@pytest.mark.parametrize("arch", list(variants()))
def test_every_variant_plans_at_830m(arch):
    """The planner runs every variant through its meta backend; more attention work means more activations."""
    p = make_plan(load_preset(f"{arch}-830m"), PlanConfig(zero_stage=3, offload=False, activation_checkpointing=False))
    base = make_plan(
        load_preset("transformer-830m"), PlanConfig(zero_stage=3, offload=False, activation_checkpointing=False)
    )
    assert p.fitting and p.rows[0].activations_per_sample >= base.rows[0].activations_per_sample


@pytest.mark.slow
def test_cli_table_and_unknown_preset():
    ok = subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "plan", "model=diff-13.1b", "nodes=8", "tokens=1T"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert "| 3 | yes | no |" in ok.stdout and "time" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "plan", "model=nope"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "unknown model=nope" in bad.stderr
    neg = subprocess.run(
        [sys.executable, "-m", "diffllm.cli", "plan", "tokens=-5B"], capture_output=True, text=True, timeout=120
    )
    assert neg.returncode == 2 and neg.stderr.strip() == "diffllm plan: error: tokens: must be positive, got '-5B'"


def test_the_zero3_weight_shard_is_in_the_weights_column():
    """Each GPU's bf16 shard of the weights under ZeRO-3 (2 B x params / GPUs) shows as its weights, not 0.00; the
    `zero-3 extra` column is the gather buffer alone (4 B x the largest layer)."""
    cfg = load_preset("diff-13.1b")
    p = make_plan(cfg, PlanConfig(nodes=8, gpus_per_node=8, gpu="h100", zero_stage=3, offload=False))
    row = next(r for r in p.rows if not r.checkpointing)
    cells = next(line for line in render(p).splitlines() if line.startswith("| 3 | no | no |")).split(" | ")
    assert float(cells[3]) == round(2 * p.total_params / 64 / GiB, 2) > 0
    assert float(cells[6]) == round(row.states.gather_buffer / GiB, 2)
