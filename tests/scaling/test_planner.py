"""The planner against independent references: DeepSpeed's own memory estimators, autograd's saved tensors on a real
CPU forward, and hand arithmetic for FLOPs and time."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import re
import time

import pytest
import torch

from diffllm.model import variants
from diffllm.model.accounting import meta_model
from diffllm.model.decoder import Block
from diffllm.model.layers import rotary_cos_sin
from diffllm.model.presets import load_preset
from diffllm.scaling.activations import LiveBytes, activation_bytes, peak_bytes
from diffllm.scaling.planner import GiB, PlanConfig, largest_layer_params, make_plan, model_states, render
from diffllm.train.zero import zero_knobs
from tests.distributed import cli_here
from tests.saved_bytes import saved_storage_bytes

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
    saved, y = saved_storage_bytes(lambda: block(x, cos, sin), block.parameters())
    y.sum().backward()  # the saved tensors really are enough for backward
    return saved / seq_len


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


def _gib_in(message: str, key: str) -> float:
    return float(re.search(key + r" ([\d.]+) GiB", message).group(1))


def test_what_does_not_fit_says_what_it_needs_and_what_would():
    """One line, consistent: the need of the setting asked for is above what the GPUs offer, then the setting that
    fits; with no setting fitting at all, the least any needs and "cluster too small"."""
    with pytest.raises(ValueError) as e:
        make_plan(
            load_preset("diff-1.4b"),
            PlanConfig(
                global_batch_tokens="262144",
                zero_stage=1,
                activation_checkpointing=False,
                offload=False,
                micro_batch_size=16,
            ),
        )
    line = str(e.value)
    assert line.startswith("does not fit: diff-1.4b needs ") and "micro_batch_size=16; 1x8 h100 offer" in line
    assert _gib_in(line, "needs") > _gib_in(line, "offer") == 71.6  # never "needs 17.3 ... 71.6 offered"
    fits = dict(kv.split("=") for kv in line.split("; fits: ")[1].split())
    row = make_plan(
        load_preset("diff-1.4b"),
        PlanConfig(
            global_batch_tokens="262144",
            **{k: (v == "true" if v in ("true", "false") else int(v)) for k, v in fits.items()},
        ),
    ).rows[0]
    assert row.fits and row.total <= 71.6 * GiB
    with pytest.raises(ValueError) as e:  # even ZeRO-3 with everything offloaded keeps a gather buffer of 1.9 GiB
        make_plan(load_preset("diff-13.1b"), PlanConfig(nodes=1, gpus_per_node=1, gpu="l4", usable_fraction=0.05))
    line = str(e.value)
    assert line.startswith("cluster too small: diff-13.1b needs ") and line.endswith("; use more or larger GPUs")
    assert "the least of any setting; 1x1 l4 offer 1.1 GiB each (5% of 22.4)" in line
    assert _gib_in(line, "needs") > 1.1


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
    ok = cli_here("plan", "model=diff-13.1b", "nodes=8", "tokens=1T")
    assert ok.returncode == 0, ok.stderr
    assert "| 3 | yes | no |" in ok.stdout and "time" in ok.stdout
    bad = cli_here("plan", "model=nope")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "unknown model=nope" in bad.stderr
    neg = cli_here("plan", "tokens=-5B")
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


def test_live_bytes_follow_every_storage_until_it_is_freed():
    """LiveBytes, the loss head's meter, against hand counts, on the CPU and the meta device alike: a view adds nothing,
    a freed temporary leaves, what autograd saves stays until backward frees it, the gradient arrives."""
    n = 1000  # fp32: 4,000 B a tensor
    for device in ("cpu", "meta"):
        x = torch.empty(n, device=device, requires_grad=True)  # made before: not counted
        with LiveBytes() as live:
            y = x.exp()  # 4,000 B (exp saves its output for backward)
            view = y[: n // 2]  # a view: nothing
            z = view * 2  # 2,000 B
            assert (live.live, live.peak) == (6000, 6000), device
            del view, z  # the temporary goes; y stays
            loss = y.sum()  # 4 B
            del y  # still held by exp's backward
            assert live.live == 4004, device
            loss.backward()  # the seed (4 B), x.grad = seed * exp(x): 4,000 B; then the graph frees y
            del loss
            assert (live.live, live.peak) == (4000, 8008), device  # x.grad alone remains


def _real_head(cfg, seq_len: int, mb: int) -> tuple[int, int]:
    """The final norm and head_loss of `cfg` on real fp32 CPU tensors, forward and backward on `mb` sequences: (peak
    bytes by LiveBytes with the parameters' gradients dropped as they arrive, bytes autograd saves by storage)."""
    from diffllm.model.layers import build_norm
    from diffllm.model.loss import head_loss

    torch.manual_seed(0)
    norm, head = build_norm(cfg.norm, cfg.d_model, cfg.norm_eps), torch.nn.Linear(cfg.d_model, cfg.padded_vocab_size)
    head.bias = None
    for p in [*norm.parameters(), *head.parameters()]:
        p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    x = torch.randn(mb, seq_len, cfg.d_model, requires_grad=True)
    targets = torch.randint(0, cfg.vocab_size, (mb, seq_len))
    peak = peak_bytes(lambda: head_loss(head, norm(x), targets, None, 1.0, "mean").backward())
    saved, _ = saved_storage_bytes(
        lambda: head_loss(head, norm(x), targets, None, 1.0, "mean"), [*norm.parameters(), *head.parameters()]
    )
    return peak, saved


@pytest.mark.parametrize("preset", ["transformer-tiny", "diff-tiny"])
def test_the_loss_head_is_head_loss_measured_at_any_micro_batch(preset):
    """The planner's loss head is diffllm.model.loss.head_loss measured on the meta device at 1 and 2 sequences: the
    same bytes as a real CPU run (saved and peak), and its line through them meets a real run at 3 sequences within
    1% (the peak falls at another op as the batch grows: 32 KiB off at 23 MB)."""
    cfg = load_preset(preset)
    act = activation_bytes(cfg, 64, dtype=torch.float32)
    (peak1, saved1), (peak2, _), (peak3, _) = (_real_head(cfg, 64, mb) for mb in (1, 2, 3))
    assert (act.head(1), act.head(2)) == (peak1, peak2)
    assert act.head(3) == pytest.approx(peak3, rel=0.01)
    assert act.head_saved * 64 == pytest.approx(saved1, rel=0.02)
    assert act.head_per_sequence > act.head_saved * 64 > 0  # the backward's transients come on top of what it saves


def test_the_diagnostics_level_is_counted_at_full_only():
    """full: the fp32 attention logits of one sequence (every softmax map, their absolute values, the causal half:
    about 2.5 maps, measured) and a block tensor's full fp32 gradient and its square; cheap and off: nothing."""
    cfg = load_preset("diff-830m")

    def row(level: str, stage: int = 2):
        pc = PlanConfig(
            global_batch_tokens="262144",
            zero_stage=stage,
            activation_checkpointing=False,
            offload=False,
            micro_batch_size=2,
            diagnostics=level,
        )
        return make_plan(cfg, pc)

    off, cheap, full = row("off"), row("cheap"), row("full")
    assert off.rows[0].total == cheap.rows[0].total and cheap.rows[0].diagnostics == 0 == off.rows[0].diagnostics
    maps = cfg.n_heads * 2048 * 2048 * 4  # Diff: n_heads / 2 heads of 2 maps; fp32
    assert 2.5 * maps <= full.logits_bytes <= 3 * maps
    block = max(p.numel() for p in meta_model(cfg).layers.parameters())
    assert full.gather_bytes == 8 * block
    assert full.rows[0].total - cheap.rows[0].total == full.rows[0].diagnostics == full.logits_bytes
    assert row("full", 3).rows[0].diagnostics == 0  # no logit recompute under ZeRO-3, the gather after backward


def test_plan_prints_the_deepspeed_knobs_and_counts_their_buckets():
    """The knobs of train/zero.py, printed; the buckets they cost in the total (ZeRO-2: two bf16 buffers with
    overlap_comm and the flat copy of one); a trainer.deepspeed override changes both."""
    cfg = load_preset("diff-13.1b")
    pc = PlanConfig(
        nodes=8,
        global_batch_tokens="262144",
        activation_checkpointing=True,
        offload=False,
        micro_batch_size=2,
        diagnostics="cheap",
    )
    p = make_plan(cfg, pc)
    lines = render(p).splitlines()
    z2 = next(line for line in lines if line.startswith("deepspeed    ZeRO-1/2: "))
    z3 = next(line for line in lines if line.startswith("deepspeed    ZeRO-3: "))
    assert f"overlap_comm=true contiguous_gradients=true reduce_scatter=true reduce_bucket_size={5120**2} " in z2
    assert f"stage3_prefetch_bucket_size={int(0.9 * 5120**2)} stage3_param_persistence_threshold=51200 " in z3
    two = next(r for r in p.rows if r.stage == 2)
    assert two.buckets.total == 3 * 5120**2 * 2 and two.knobs == zero_knobs(2, 5120)
    over = {"zero_optimization": {"overlap_comm": False, "reduce_bucket_size": 5 * 10**8}}
    q = make_plan(cfg, dataclasses.replace(pc, zero_stage=2, deepspeed=over))
    assert q.rows[0].buckets.total == 2 * 5 * 10**8 * 2  # one buffer and its copy: DeepSpeed's default bucket
    assert q.rows[0].total - two.total == pytest.approx(q.rows[0].buckets.total - two.buckets.total)
    assert "overlap_comm=false" in render(q) and "reduce_bucket_size=500000000 " in render(q)
