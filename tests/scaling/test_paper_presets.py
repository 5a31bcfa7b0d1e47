"""The GPU trainer presets fit as they stand: trainer=paper-scaling (and each trainer=paper-scaling-<size>) for every
paper size, trainer=paper-3b for the 3B models, on 1-8 nodes of 8 x 80 GB H100s, as `diffllm launch --gpu h100`
checks them (the composed train config with the model put in, its budget in whole steps at that world size,
`diffllm plan`'s memory for its settings); and `diffllm plan trainer=<preset>` plans the preset's own settings.
In-process: Diff here, the other archs (Transformer, Diff V2, MLA, GQA) in the slow suite."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from diffllm.config import compose
from diffllm.launch.checks import check_budget, check_memory, check_train_overrides
from diffllm.model.presets import load_preset
from diffllm.scaling.planner import GiB, make_plan, plan_config, render
from diffllm.train.config import TrainConfig

SIZES = ["830m", "1.4b", "2.8b", "6.8b", "13.1b"]
NODES = [1, 2, 4, 8]  # of 8 GPUs; memory per GPU only falls with more nodes, the micro-batch must still divide


@functools.cache
def _composed(trainer: str, optim: str, *extra: str) -> TrainConfig:
    """The train config `diffllm launch ... trainer=<trainer>` composes and checks (once per preset: the trainer's
    keys do not depend on the model, which each test puts in with load_preset)."""
    return check_train_overrides(["data=fineweb-edu", f"trainer={trainer}", f"optim={optim}", *extra], 8)


def _fits_everywhere(model: str, trainer: str, optim: str, *extra: str) -> None:
    typed = dataclasses.replace(_composed(trainer, optim, *extra), model=load_preset(model))
    typed.check_together()
    t = typed.trainer
    assert t.zero_stage <= 2 and t.compile and t.diagnostics == "cheap" and not t.offload_optimizer, trainer
    for nodes in NODES:
        check_budget(typed, 8 * nodes)  # whole steps: the micro-batch divides the batch on every rank
        check_memory(typed, nodes, 8, "h100")  # what `diffllm launch --gpu h100` checks: raises when it does not fit


def _paper_scaling(model: str, size: str) -> None:
    for trainer in ("paper-scaling", f"paper-scaling-{size}"):
        _fits_everywhere(model, trainer, "paper-scaling", "model=diff-830m")


@pytest.mark.parametrize("size", SIZES)
def test_paper_scaling_presets_fit_every_paper_size(size):
    """Diff: of the sweep's two archs the one with the more activations (test_planner's every-variant test)."""
    _paper_scaling(f"diff-{size}", size)


@pytest.mark.slow  # 30 more models, each a meta model built twice
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("arch", ["transformer", "diff2", "mla", "transformer-{}-gqa", "diff-{}-gqa", "diff2-{}-gqa"])
def test_paper_scaling_presets_fit_every_other_arch(arch, size):
    _paper_scaling(arch.format(size) if "{}" in arch else f"{arch}-{size}", size)


def test_paper_3b_fits():
    _fits_everywhere("diff-3b", "paper-3b", "paper-3b", "data.seq_len=4096", "model=diff-3b")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["transformer", "diff2", "mla"])
def test_paper_3b_fits_every_other_arch(arch):
    _fits_everywhere(f"{arch}-3b", "paper-3b", "paper-3b", "data.seq_len=4096", "model=diff-3b")


def test_plan_reads_a_trainer_presets_settings_and_the_command_line_wins():
    model, pc = plan_config(compose("plan", ["model=diff-13.1b", "trainer=paper-scaling", "nodes=1"]))
    assert (pc.global_batch_tokens, pc.tokens, pc.zero_stage, pc.activation_checkpointing, pc.offload) == (
        "262144",
        "10485760000",
        2,
        True,
        False,
    )
    assert (pc.micro_batch_size, pc.diagnostics, pc.deepspeed) == (2, "cheap", {})
    p = make_plan(model, pc)
    fits = next(line for line in render(p).splitlines() if line.startswith("fits "))
    assert fits.startswith("fits         zero_stage=2 activation_checkpointing=true micro_batch_size=2 (")
    assert p.rows[0].total <= p.budget_bytes == 79.6 * 0.9 * GiB
    mine = ["trainer=paper-scaling", "zero_stage=1", "micro_batch_size=1"]
    _, mine = plan_config(compose("plan", mine), given=["zero_stage", "micro_batch_size"])
    assert (mine.zero_stage, mine.micro_batch_size, mine.global_batch_tokens) == (1, 1, "262144")
    _, bare = plan_config(compose("plan", []))
    assert (bare.zero_stage, bare.micro_batch_size, bare.diagnostics, bare.global_batch_tokens) == (
        None,
        None,
        "full",
        "4194304",
    )
