"""What a training step makes the host wait for and sends between ranks, counted on CPU with the harness of
tests/train/counting.py (host syncs, blocking copies, collectives; each attributed to diffllm's, DeepSpeed's or
torch's code by its calling frames), on real DeepSpeed engines at ZeRO 0-3, fp32 and bf16, 1 and 2 ranks:

- a plain step: diffllm's own code makes at most 2 host syncs (the agreement's readback; DeepSpeed's grad norm) and
  no blocking copy; the total, DeepSpeed's and torch's included, does not grow with depth (2 -> 8 layers) or gradient
  accumulation (1 -> 8 micro-batches), but for DeepSpeed's own per-parameter overflow check of bf16 without ZeRO
  (FP16_UnfusedOptimizer's has_overflow_serial: one per parameter tensor, DeepSpeed's code); diffllm makes one
  collective, and the total does not grow with depth but for ZeRO-3's re-gather of its persistent parameters after
  each update (one all-gather per parameter tensor, DeepSpeed's, by design of ZeRO-3);
- a logged step at trainer.diagnostics=cheap: one collective and one readback more, whatever the depth;
- the one decision per step: rank 0's NaN gradient (its loss finite) drops the update on every rank;
- cheap's per-block norms, read from each rank's own partition, equal full's (gathered whole) and a float64
  reference of the weights, and the trajectory does not depend on the diagnostics level;
- DeepSpeed's CPU Adam under trainer.offload_optimizer trains and skips as torch AdamW does (where its op builds).
"""

from __future__ import annotations

import math
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.distributed import run_distributed
from tests.train.counted_step import Spec, count_all

STAGES, PRECISIONS = (0, 1, 2, 3), ("fp32", "bf16")
SHAPES = {"base": dict(nan_grad_at=1), "deep": dict(layers=8), "long": dict(accum=8)}


def matrix() -> list[Spec]:
    """Every stage and precision three times, at the presets' diagnostics level: 2 layers and 1 micro-batch (with
    rank 0's NaN gradient at step 1, before the counted steps), 8 layers, 8 micro-batches."""
    return [
        Spec(stage=s, precision=p, diagnostics="cheap", **kw)
        for s in STAGES
        for p in PRECISIONS
        for kw in SHAPES.values()
    ]


TWO_RANKS = [
    *matrix(),
    *[Spec(stage=s, diagnostics="full", nan_grad_at=1) for s in STAGES],  # cheap's values against full's
    Spec(stage=2, diagnostics="off", nan_grad_at=1),
]


@pytest.fixture(scope="module")
def counted() -> dict[int, list[dict]]:
    """{world size: every rank's results}: TWO_RANKS on a 2-rank gloo group and the matrix on a 1-rank one, the two
    launches side by side (one process each per rank; each runs all its configurations)."""
    with ThreadPoolExecutor(2) as pool:
        two = pool.submit(run_distributed, count_all, 2, (TWO_RANKS,), 1200)
        one = pool.submit(run_distributed, count_all, 1, (matrix(),), 1200)
        return {2: two.result(), 1: one.result()}


@pytest.fixture(scope="module")
def two_ranks(counted) -> list[dict]:
    return counted[2]


@pytest.fixture(scope="module")
def one_rank(counted) -> list[dict]:
    return counted[1]


def name(stage: int, precision: str = "fp32", shape: str = "base", level: str = "cheap") -> str:
    return Spec(stage=stage, precision=precision, diagnostics=level, **SHAPES[shape]).name


def per_parameter_check(counts: dict) -> int:
    """DeepSpeed's has_overflow_serial syncs of the plain step (bf16 without ZeRO: one per parameter tensor)."""
    return sum(n for site, n in counts["sites"][3].items() if "(has_overflow_serial)" in site)


def gathered_parameters(counts: dict) -> int:
    """DeepSpeed's all-gathers of the plain step (under ZeRO-3 after its update: one per persistent parameter)."""
    return sum(n for site, n in counts["sites"][3].items() if site.startswith("deepspeed collective:all_gather_into"))


def check_plain_steps(results: dict, world_size: int) -> None:
    """diffllm <= 2 syncs, no blocking copy of ours; totals as the base's at 8 layers and at 8 micro-batches (but
    DeepSpeed's per-parameter overflow check of bf16 without ZeRO); one collective of ours, and the total as the
    base's at 8 layers (but ZeRO-3's re-gather of each persistent parameter after the update, DeepSpeed's)."""
    for stage in STAGES:
        for precision in PRECISIONS:
            runs = {shape: results[name(stage, precision, shape)] for shape in SHAPES}
            plain = {shape: r["plain"][0] for shape, r in runs.items()}
            where = f"ZeRO-{stage} {precision} at {world_size} ranks: " + str(
                {k: r["sites"][3] for k, r in runs.items()}
            )
            assert plain["base"]["syncs_by_owner"].get("diffllm", 0) <= 2, where
            assert not any(site.startswith("diffllm copy") for r in runs.values() for site in r["sites"][3]), where
            grows = per_parameter_check(runs["deep"]) - per_parameter_check(runs["base"])
            more = runs["deep"]["parameters"] - runs["base"]["parameters"]
            assert grows == (more if (stage, precision) == (0, "bf16") else 0), where  # DeepSpeed's: one per tensor
            assert plain["deep"]["syncs"] - grows == plain["base"]["syncs"] == plain["long"]["syncs"], where
            ours = {k: r["plain"][0]["collectives_by_owner"].get("diffllm") for k, r in runs.items()}
            assert ours == {"base": 1, "deep": 1, "long": 1}, where  # the agreement
            gathers = gathered_parameters(runs["deep"]) - gathered_parameters(runs["base"])
            persistent = runs["deep"]["persistent"] - runs["base"]["persistent"]  # ZeRO-3's: re-gathered, each
            assert gathers == (persistent if world_size > 1 else 0), where
            assert plain["deep"]["collectives"] - gathers == plain["base"]["collectives"], where


def check_logged_steps(results: dict) -> None:
    """cheap: a logged step costs its plain step's plus one collective and one readback, whatever the depth."""
    for spec in matrix():
        r = results[spec.name]
        [plain], [logged] = r["plain"], r["logged"]
        assert logged["syncs"] == plain["syncs"] + 1, (spec.name, r["sites"][4])
        assert logged["collectives"] == plain["collectives"] + 1, (spec.name, r["sites"][4])


@pytest.mark.slow  # the two launches: 3 processes, 53 engines
def test_two_ranks_plain_steps_do_not_grow_with_depth_or_accumulation(two_ranks):
    check_plain_steps(two_ranks[0], 2)


@pytest.mark.slow
def test_two_ranks_logged_steps_at_cheap_do_not_grow_with_depth(two_ranks):
    check_logged_steps(two_ranks[0])


@pytest.mark.slow
def test_one_rank_counts(one_rank):
    check_plain_steps(one_rank[0], 1)
    check_logged_steps(one_rank[0])


@pytest.mark.slow
def test_a_nan_gradient_on_one_rank_drops_the_update_on_every_rank(two_ranks):
    """Rank 0's gradients at step 1 are NaN, its loss is finite: the shared global grad norm is not finite, so every
    rank skips (DeepSpeed's own check or the gate), its weights stay as they were, and step 2 trains again."""
    for stage in STAGES:
        for precision in PRECISIONS:
            for rank in two_ranks:
                r = rank[name(stage, precision)]
                assert r["records"][1]["skipped"] and r["records"][1]["grad_norm"] is None, (stage, precision)
                assert math.isfinite(r["records"][1]["loss"]) and not r["records"][2]["skipped"]
                assert r["kept"], (stage, precision)
            assert two_ranks[0][name(stage, precision)]["records"] == two_ranks[1][name(stage, precision)]["records"]


@pytest.mark.slow
def test_cheap_norms_from_the_partitions_equal_full_and_the_weights(two_ranks):
    """At each stage, on 2 ranks (so each rank holds part of every partitioned tensor): cheap's block grad norms and
    forward values equal full's (each parameter's gradient gathered whole), its weight norms a float64 reference of
    the full fp32 weights; the losses and global grad norms do not depend on the level (full, cheap, off)."""
    r = two_ranks[0]
    for stage in STAGES:
        cheap, full = r[name(stage)]["records"][4], r[name(stage, level="full")]["records"][4]
        for key, want in full.items():
            if key.startswith(("grad_norm/", "act_max/", "attn_rms/", "lambda")):
                assert cheap[key] == pytest.approx(want, rel=1e-5), (stage, key)
            if key.startswith("attn_logit_max/"):  # cheap's: of the first sequence of the 2 full takes
                assert 0 < cheap[key] <= want * (1 + 1e-6), (stage, key)
        assert {k for k in full if "/" in k} <= set(cheap)
        for i in (0, 1):
            assert cheap[f"weight_norm/{i}"] == pytest.approx(r[name(stage)]["reference"][i], rel=1e-6), stage
        keys = ("loss", "grad_norm", "loss_tokens", "skipped")
        assert [[rec[k] for k in keys] for rec in r[name(stage)]["records"].values()] == [
            [rec[k] for k in keys] for rec in r[name(stage, level="full")]["records"].values()
        ]
    off = r[name(2, level="off")]["records"]
    assert not any("/" in k for rec in off.values() for k in rec)
    assert [rec["loss"] for rec in off.values()] == [rec["loss"] for rec in r[name(2)]["records"].values()]


def cpu_adam_builds() -> str:
    """'' when DeepSpeed's CPU Adam op loads here (JIT-built on first use: ninja and a C++ compiler; cached in
    ~/.cache/torch_extensions), else why it cannot."""
    if not (shutil.which("ninja") and (shutil.which("c++") or shutil.which("g++"))):
        return "no ninja or C++ compiler on PATH"
    from deepspeed.ops.op_builder import CPUAdamBuilder

    builder = CPUAdamBuilder()
    if not builder.is_compatible(verbose=False):
        return "CPUAdamBuilder says it is not compatible with this machine"
    try:
        builder.load(verbose=False)
    except Exception as e:  # noqa: BLE001 - whatever the build raises is the reason
        return f"its JIT build failed: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
    return ""


@pytest.mark.slow  # the op's first JIT build takes minutes (737 s on this 2-core machine under load), then ~1 s
def test_offloaded_cpu_adam_trains_and_skips_as_torch_adamw():
    why = cpu_adam_builds()
    if why:
        pytest.skip(f"DeepSpeed's CPU Adam op cannot be built here: {why}")
    specs = [Spec(stage=2, nan_grad_at=1, offload=True), Spec(stage=2, nan_grad_at=1)]
    [r] = run_distributed(count_all, world_size=1, args=(specs,), timeout=600)
    offloaded, plain = r[specs[0].name], r[specs[1].name]
    assert "DeepSpeedCPUAdam" in offloaded["optimizer"] and "DeepSpeedCPUAdam" not in plain["optimizer"]
    assert offloaded["records"][1]["skipped"] and plain["records"][1]["skipped"] and offloaded["kept"]
    for step, rec in plain["records"].items():
        got = offloaded["records"][step]
        assert got["skipped"] == rec["skipped"], step
        for key in ("loss", "grad_norm", "grad_norm/0", "grad_norm/1", "weight_norm/0", "weight_norm/1"):
            if rec.get(key) is not None:
                assert got[key] == pytest.approx(rec[key], rel=1e-5), (step, key)


def test_one_rank_zero2_counts_fast():
    """The fast suite's guard (one process, three engines): ZeRO-2 fp32, 2 layers and 1 micro-batch against 8 and 8:
    diffllm's syncs <= 2, the same totals, and cheap's logged step one collective and one readback more."""
    specs = [Spec(stage=2, diagnostics="cheap", nan_grad_at=1), Spec(stage=2, diagnostics="cheap", layers=8, accum=8)]
    [r] = run_distributed(count_all, world_size=1, args=(specs,), timeout=300)
    [a], [b] = r[specs[0].name]["plain"], r[specs[1].name]["plain"]
    assert a["syncs_by_owner"].get("diffllm", 0) <= 2 and a["syncs"] == b["syncs"], r[specs[0].name]["sites"][3]
    assert b["collectives"] - a["collectives"] == 7  # ZeRO-2 reduces as each backward ends: 7 more micro-batches
    for spec in specs:
        [plain], [logged] = r[spec.name]["plain"], r[spec.name]["logged"]
        assert (logged["syncs"], logged["collectives"]) == (plain["syncs"] + 1, plain["collectives"] + 1)


def test_the_harness_counts_what_it_claims_and_attributes_it(monkeypatch):
    """In this process, a world of one: each kind of sync once, a blocking batch copy (not a non-blocking one), an
    upload, collectives by either name (one inside another counted once); a value computed on the host from a readback
    is no sync, nor are torch.optim's step counters; owners: diffllm's code, torch's called from elsewhere, a test's."""
    import torch
    import torch.distributed as dist

    from diffllm.data.batch import Batch
    from diffllm.train.dist import all_reduce_sum, set_env_defaults
    from tests.train.counting import Counter

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    set_env_defaults()
    dist.init_process_group("gloo")
    try:
        t, mask = torch.arange(6.0), torch.tensor([True, False] * 3)
        w = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.AdamW([w], lr=0.1)
        w.grad = torch.ones(3)
        with Counter() as counter:
            counter.start(1)
            t.sum().item(), t.tolist(), bool(t[0]), float(t[1]), int(t[2]), t.nonzero(), t[mask]
            host = t.cpu()
            float(host.sum() * 2)  # computed on the host from a readback: no sync
            Batch(tokens=torch.zeros(1, 3, dtype=torch.long)).to("cpu")
            Batch(tokens=torch.zeros(1, 3, dtype=torch.long)).to("cpu", non_blocking=True)
            torch.tensor([1.0], device="cpu")
            dist.all_reduce(t.clone()), dist.distributed_c10d.all_reduce(t.clone())
            dist.all_gather_object([None], 1)  # its own inner collectives are not counted again
            all_reduce_sum([1.0])  # diffllm's: an upload, a collective, a readback
            torch.nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)  # torch's own check, called from here
            opt.step()  # torch.optim reads its step counter (a host tensor unless capturable/fused): no sync
            counter.stop()
    finally:
        dist.destroy_process_group()
    sites = counter.steps[1].sites()
    mine = {k.split(" ", 1)[1].split(" ")[0]: n for k, n in sites.items() if k.startswith("other ")}
    assert mine == {
        "sync:item": 1,
        "sync:tolist": 1,
        "sync:__bool__": 1,
        "sync:__float__": 1,
        "sync:__int__": 1,
        "sync:nonzero": 1,
        "sync:getitem[bool]": 1,
        "sync:cpu": 1,
        "copy:Batch.to": 1,
        "copy:torch.tensor(device=)": 1,
        "collective:all_reduce": 2,
        "collective:all_gather_object": 1,
    }, sites
    ours = {k.split(" ")[1]: n for k, n in sites.items() if k.startswith("diffllm ")}
    assert ours == {"copy:torch.tensor(device=)": 1, "collective:all_reduce": 1, "sync:tolist": 1}, sites
    assert any(k.startswith("torch sync:") and "clip_grad" in k for k in sites), sites
    assert sum(n for k, n in sites.items() if "optim" in k) == 0, sites
