"""What `diffllm launch` and `diffllm sweep` refuse before anything is written, queued or started (issue 31, defect 2):
a window longer than the model's context, a misspelt sweep axis (every job's config is composed and checked), a run
`diffllm plan` says does not fit on the chosen GPU, and advice that names a preset already given. The paper's runs
(docs, sweeps) get the paper's data and learning rate per size."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from diffllm.config import build, compose
from diffllm.launch.checks import check_memory, check_train_overrides
from diffllm.model.presets import load_preset
from diffllm.sweep.check import check_jobs
from diffllm.sweep.grid import SweepConfig, plan_runs
from tests.distributed import cli_here

REPO = Path(__file__).resolve().parents[2]
# Diff Transformer §3.2 (../shared/reference/diff-transformer-spec.md): 1.5e-3 for 830M-2.8B, 7.5e-4 for 6.8B-13.1B
PAPER_LR = {"830m": 1.5e-3, "1.4b": 1.5e-3, "2.8b": 1.5e-3, "6.8b": 7.5e-4, "13.1b": 7.5e-4}
BIG = ["model=diff-13.1b", "data=fineweb-edu", "trainer=paper-scaling", "optim=paper-scaling", "optim.lr=7.5e-4"]
SLURM_4X8 = ["--launcher", "slurm", "--nodes", "4", "--procs", "8", "--dry-run"]


def refused(out: subprocess.CompletedProcess) -> str:
    """The one line of a refusal (exit code 2, nothing on stdout)."""
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, out.stdout + out.stderr
    return out.stderr.strip()


def test_a_window_longer_than_the_model_context_is_refused():
    line = refused(cli_here("launch", "--dry-run", "model=diff-830m", "data.seq_len=4096"))
    assert line == (
        "diffllm launch: error: data.seq_len=4096: longer than model.max_seq_len=2048 (the model's context); "
        "use data.seq_len <= 2048, or set model.max_seq_len"
    )


def test_a_misspelt_sweep_axis_is_refused_before_anything_is_planned(tmp_path):
    grid = {
        "name": "typo",
        "models": ["transformer-micro-1", "diff-micro-1"],
        "tokens": ["512K"],
        "seeds": [1, 2],
        "grid_by_model": {"*-micro-1": {"optim.lrr": [8e-3]}},
    }
    (tmp_path / "configs" / "sweep").mkdir(parents=True)
    (tmp_path / "configs" / "sweep" / "typo.yaml").write_text(yaml.safe_dump(grid))
    root = tmp_path / "runs"
    for dry in ("true", "false"):
        line = refused(cli_here("sweep", "sweep=typo", f"sweep_dir={root}", f"dry_run={dry}", cwd=tmp_path))
        assert line == (
            f"diffllm sweep: error: the job of {root}/transformer-micro-1/512K/lrr=0.008/seed1: optim.lrr=0.008: "
            f"unknown key (did you mean optim.lr?)"
        )
    assert not root.exists()


ZERO1 = ["trainer.zero_stage=1", "trainer.activation_checkpointing=false", "trainer.micro_batch_size=2"]


def test_a_run_that_does_not_fit_is_refused_in_one_consistent_line():
    """13.1B at ZeRO-1 without activation checkpointing, micro-batch 2, on 4 x 8 H100: what it needs (and of what) is
    above what the GPUs offer, and the setting named after `fits:` does fit (and on H200s the run itself does)."""
    with pytest.raises(ValueError) as e:
        check_memory(check_train_overrides([*BIG, *ZERO1], 32), 4, 8, "h100")
    line = str(e.value)
    parts = re.fullmatch(
        r"does not fit: diff-13.1b needs ([\d.]+) GiB per GPU \(model states ([\d.]+) \+ buckets ([\d.]+) \+ "
        r"activations ([\d.]+) \+ diagnostics ([\d.]+)\) at (.*); 4x8 h100 offer ([\d.]+) GiB each \(90% of 79.6\); "
        r"fits: (.*) \(--memory-check false: launch anyway\)",
        line,
    )
    assert parts, line
    need, states, buckets, acts, diag, asked, offer, fits = parts.groups()
    assert float(need) > float(offer) == 71.6 and asked.split() == ZERO1
    assert float(need) == pytest.approx(sum(map(float, (states, buckets, acts, diag))), abs=0.25)
    assert float(diag) == 0  # trainer=paper-scaling: diagnostics=cheap
    assert fits.split() == [
        "trainer.zero_stage=2",
        "trainer.activation_checkpointing=false",
        "trainer.micro_batch_size=1",
    ]
    check_memory(check_train_overrides([*BIG, *fits.split()], 32), 4, 8, "h100")  # what it names fits
    check_memory(check_train_overrides([*BIG, *ZERO1], 32), 4, 8, "h200")  # and on H200s the run asked for


@pytest.mark.slow  # 20-30 s on a loaded 2-core machine (docs/launch.md's refusal runs in make test)
def test_launch_refuses_what_plan_says_does_not_fit():
    """The same through the CLI, and `diffllm plan` with that row alone says the same, in plan's own keys."""
    from diffllm.scaling.config import PlanConfig
    from diffllm.scaling.planner import make_plan

    plan = PlanConfig(
        2048,
        "262144",
        "10B",
        4,
        8,
        "h100",
        zero_stage=1,
        activation_checkpointing=False,
        offload=False,
        micro_batch_size=2,
        diagnostics="cheap",
    )
    with pytest.raises(
        ValueError,
        match="does not fit: diff-13.1b needs .* at zero_stage=1 activation_checkpointing="
        "false micro_batch_size=2; 4x8 h100 offer 71.6 GiB .*; fits: zero_stage=2 "
        "activation_checkpointing=false micro_batch_size=1$",
    ):
        make_plan(load_preset("diff-13.1b"), plan)
    line = refused(cli_here("launch", *SLURM_4X8, "--gpu", "h100", *BIG, *ZERO1))
    assert line.startswith("diffllm launch: error: does not fit: diff-13.1b needs ")
    fits = re.search(r"fits: (.*) \(--memory-check false", line).group(1).split()
    assert fits == ["trainer.zero_stage=2", "trainer.activation_checkpointing=false", "trainer.micro_batch_size=1"]
    anyway = cli_here("launch", *SLURM_4X8, "--gpu", "h100", "--memory-check", "false", *BIG, *ZERO1)
    assert anyway.returncode == 0 and "model=diff-13.1b" in anyway.stdout


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_advice_never_names_a_preset_already_given():
    paper = refused(cli_here("launch", *SLURM_4X8, *BIG, "trainer.micro_batch_size=8"))  # 8 x 2048 x 32 > the 262,144
    assert "trainer=paper-scaling" not in paper and paper.endswith("or trainer.micro_batch_size=4")
    cpu = refused(
        cli_here("launch", *SLURM_4X8, "model=diff-830m")
    )  # the CPU trainer on a cluster: still pointed there
    assert cpu.endswith("a paper-size model on a cluster wants trainer=paper-scaling)")


@pytest.mark.parametrize("name", ["paper", "paper-branch"])
def test_paper_sweeps_train_the_paper_lr_per_size_on_its_data(name):
    grid = build(SweepConfig, compose("sweep", [f"sweep={name}"]).sweep, "sweep")
    stable = [r for r in plan_runs(grid, "runs") if r.parent is None]  # one job per model (a cooldown: its budget)
    for (model, _), typed in check_jobs(stable, grid, "runs", 64).items():
        assert typed.optim.lr == PAPER_LR[model.rsplit("-", 1)[1]], model
        assert (typed.data.name, typed.data.seq_len) == ("fineweb-edu", 2048)


def test_the_documented_13b_slurm_run_is_the_paper_run():
    text = (REPO / "docs" / "launch.md").read_text()
    block = text[text.index("$ diffllm launch --launcher slurm --nodes 4 --procs 8 --gpu h100 --partition") :]
    args = " ".join(line.strip().rstrip("\\") for line in block.splitlines()[:3]).split()
    typed = check_train_overrides([a for a in args if "=" in a and not a.startswith("-")], 32)
    assert (typed.model.name, typed.data.name, typed.data.seq_len) == ("diff-13.1b", "fineweb-edu", 2048)
    assert typed.optim.lr == PAPER_LR["13.1b"]
