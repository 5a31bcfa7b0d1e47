"""WSD branches (issue 22): a cooldown started from a long WSD run's branch checkpoint trains bit for bit as a
from-scratch WSD run of its budget (1 rank; 2 ranks under ZeRO-2 with a kill -9 inside the cooldown), the branch
points follow lr_at's own arithmetic, and a branch that would differ from its parent before the branch point is
refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from diffllm.export import export_run
from diffllm.results import collect
from diffllm.runs import Run, consolidated_state_dict, read_metrics
from tests.distributed import launch_train, run_train
from tests.train.helpers import SESSION, TINY, WORKERS, comparable
from tests.train.test_cli import diffllm_train
from tests.train.test_run_dir import one_error_line

# Steps of 1024 tokens: the parent trains 12 steps (WSD, decay over the last 6: from step 6), keeping the branch point
# of a budget of 8 steps (decay over the last 4: from step 4); the branch cools down from 4 to 8.
WSD = [a for a in TINY if not a.startswith(("trainer.tokens=", "optim.warmup_steps="))] + [
    "optim.schedule=wsd",
    "optim.decay_fraction=0.5",
    "optim.warmup_steps=2",
    *WORKERS,  # its runs are killed and relaunched
]
PARENT, BUDGET, BRANCH_STEP = 12 * 1024, 8 * 1024, 4


def args(run_dir: Path, *extra: str) -> list[str]:
    return [*WSD, f"run_dir={run_dir}", "trainer.zero_stage=2", *extra]


@pytest.fixture(scope="module")
def wsd(tokenizer):
    """wsd(world_size) -> (parent run_dir, from-scratch run_dir of the branch budget), made once per world size."""
    made: dict[int, tuple[Path, Path]] = {}

    def get(ws: int) -> tuple[Path, Path]:
        if ws not in made:
            root = SESSION / f"wsd-{ws}"
            run_train(
                args(
                    root / "parent",
                    f"trainer.tokens={PARENT}",
                    f"trainer.branch_budgets=[{BUDGET}]",
                    "trainer.save_every_steps=3",
                    "trainer.keep_last=1",
                ),
                ws,
                root / "parent-logs",
            )
            run_train(args(root / "scratch", f"trainer.tokens={BUDGET}"), ws, root / "scratch-logs")
            made[ws] = root / "parent", root / "scratch"
        return made[ws]

    return get


def branch_args(parent: Path, run_dir: Path, *extra: str) -> list[str]:
    return args(run_dir, f"trainer.tokens={BUDGET}", f"trainer.branch_from={parent}", *extra)


@pytest.mark.slow
def test_the_parent_keeps_its_branch_checkpoint_beside_keep_last(wsd):
    """Saves every 3 steps and keep_last=1 keep step 12 alone; the branch point, step 4, is saved and kept."""
    parent, _ = wsd(1)
    assert Run(parent).steps() == [BRANCH_STEP, 12]


@pytest.mark.slow
def test_a_branch_on_one_rank_equals_a_from_scratch_run_bit_for_bit(wsd, tmp_path):
    parent, scratch = wsd(1)
    run_dir = tmp_path / "branch"
    done = run_train(branch_args(parent, run_dir), 1, tmp_path / "logs")
    out = done.output(0)
    assert f"resumed from checkpoint {parent}/checkpoints/step{BRANCH_STEP}: step {BRANCH_STEP}" in out, out
    assert comparable(read_metrics(run_dir)) == comparable(read_metrics(scratch))
    record = json.loads((run_dir / "branch.json").read_text())
    config_hash = re.search(r"parent config (\w+)\)", out).group(1)
    parent_wall = record.pop("parent_elapsed_s")  # the parent's wall time up to its checkpoint at the branch
    assert 0 < parent_wall < json.loads((parent / "summary.json").read_text())["wall_time_s"]
    assert record == {
        "parent": str(parent.resolve()),
        "step": BRANCH_STEP,
        "tokens": BRANCH_STEP * 1024,
        "parent_tokens": PARENT,
        "parent_config_hash": config_hash,
    }
    summary = json.loads((run_dir / "summary.json").read_text())
    ref = json.loads((scratch / "summary.json").read_text())
    assert summary["branch"] == {**record, "parent_elapsed_s": parent_wall} and ref["branch"] is None
    assert summary["wall_time_s"] > parent_wall  # the cooldown's wall time counts the prefix, as a scratch run's does
    mine, theirs = (
        consolidated_state_dict(Run(run_dir).checkpoint()),
        consolidated_state_dict(Run(scratch).checkpoint()),
    )
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    # collectable and exportable like any run
    (rec,) = [r for r in collect(tmp_path) if r.run_dir == str(run_dir)]
    assert (rec.status, rec.tokens, rec.final_val_loss) == ("finished", BUDGET, ref["final_val_loss"])
    assert (export_run(run_dir, tmp_path / "hf").out / "config.json").is_file()


@pytest.mark.slow
def test_a_branch_on_two_ranks_killed_in_its_cooldown_resumes_its_own_checkpoint_bit_for_bit(wsd, tmp_path):
    """ZeRO-2 on 2 ranks. The first launch saves at step 6 and then hangs reading step 7's data (fault injection:
    rank 0 never returns), where it is killed -9; the relaunch resumes the branch's own step 6, not the parent's."""
    parent, scratch = wsd(2)
    run_dir = tmp_path / "branch"
    first = launch_train(
        branch_args(parent, run_dir, "trainer.save_every_steps=2", "trainer.faults.stall_at_steps=[7]"),
        2,
        tmp_path / "logs1",
    )
    latest = run_dir / "checkpoints" / "latest"
    first.wait_until(lambda: latest.is_file() and latest.read_text() == "step6")
    first.kill()
    assert max(m["step"] for m in read_metrics(run_dir)) == 6
    again = run_train(branch_args(parent, run_dir, "trainer.save_every_steps=2"), 2, tmp_path / "logs2")
    out = again.output(0)
    assert f"resumed from checkpoint {run_dir}/checkpoints/step6: step 6" in out, out
    assert comparable(read_metrics(run_dir)) == comparable(read_metrics(scratch))
    assert Run(run_dir).branch()["parent"] == str(parent.resolve())


def branch_config(parent: Path, run_dir: Path, *extra: str):
    from diffllm.config import compose
    from diffllm.train.config import TrainConfig

    return TrainConfig.from_hydra(compose("train", branch_args(parent, run_dir, *extra)))


def refusal(parent: Path, run_dir: Path, *extra: str) -> str:
    """branch_source's one-line error for a new branch in run_dir (it reads only: nothing is written)."""
    from diffllm.budget import plan_branching, plan_budget
    from diffllm.train.checkpoints.plan import branch_source
    from diffllm.train.checkpoints.snapshot import RunSnapshot, got

    cfg = branch_config(parent, run_dir, *extra)
    with pytest.raises(ValueError) as e:
        budget = plan_budget(cfg.trainer, 64, 1)
        start = plan_branching(cfg.trainer, cfg.optim, budget).start
        snap = RunSnapshot.read(Run(run_dir), cfg.trainer.resume, cfg.trainer.branch_from, cfg.model.init_from)
        branch_source(cfg, snap, got(snap.run.latest), budget, start)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra,said",
    [
        (["optim.lr=1e-3"], "optim.lr (0.003 -> 0.001) differs from the parent run's config; a branch shares"),
        (["optim.warmup_steps=3"], "optim.warmup_steps (2 -> 3) differs"),
        (["optim.min_lr=1e-4"], "optim.min_lr (0.0003 -> 0.0001) differs"),
        (["optim.decay_fraction=0.25"], "optim.decay_fraction (0.5 -> 0.25) differs"),
        (["trainer.global_batch_tokens=2048"], "trainer.global_batch_tokens (1024 -> 2048) differs"),
        (["seed=7"], "seed (1234 -> 7) differs"),
        (["data.seed=7"], "data.seed (1234 -> 7) differs"),
        (["model.n_layers=3"], "model.n_layers (2 -> 3) differs"),
        (
            ["optim.warmup_steps=3", "optim.lr=1e-3"],
            "optim.lr (0.003 -> 0.001) differs from the parent run's config (and 1 more)",
        ),
        (["optim.schedule=linear"], "needs optim.schedule=wsd (got linear)"),
        ([f"trainer.tokens={PARENT + 1024}"], "trainer.tokens=13312: beyond the budget of trainer.branch_from="),
        (["trainer.tokens=2048"], "trainer.tokens=2048: 2 steps, not more than optim.warmup_steps=2"),
        (
            ["trainer.tokens=10240"],
            "no checkpoint at step 5, where a budget of 10240 tokens begins to decay (its "
            "checkpoints: steps 4, 12); train the parent with 10240 in trainer.branch_budgets",
        ),
    ],
)
def test_a_branch_that_would_differ_from_its_parent_is_refused_naming_the_first_key(wsd, tmp_path, extra, said):
    parent, _ = wsd(1)
    line = refusal(parent, tmp_path / "branch", *extra)
    assert line.startswith("trainer.") and said in line, line
    assert not (tmp_path / "branch").exists()


@pytest.mark.slow
def test_parents_that_cannot_be_branched_are_refused(wsd, tmp_path):
    parent, scratch = wsd(1)
    assert "not a run directory (no config.yaml)" in refusal(tmp_path / "nothing", tmp_path / "b")
    nested = tmp_path / "a-branch"  # a branch's config names its own parent
    nested.mkdir()
    text = (parent / "config.yaml").read_text().replace("branch_from: null", f"branch_from: {parent}")
    (nested / "config.yaml").write_text(text)
    assert f"a branch itself (of {parent}); branch from that run" in refusal(nested, tmp_path / "b")
    assert "the branch's own run_dir" in refusal(tmp_path / "b2", tmp_path / "b2")
    # run_dir holds another run with checkpoints (not a branch): auto would resume it, so it is refused
    assert f"run_dir={scratch} already holds another run (not a branch); use a new run_dir" in refusal(parent, scratch)


@pytest.mark.parametrize(
    "budgets,said",
    [
        ("[8192]", "trainer.branch_budgets: branches need a decay to branch into: optim.schedule=wsd"),
        (
            "[1000]",
            "trainer.branch_budgets[0]=1000: not a whole number of steps of trainer.global_batch_tokens=1024; use 1024",
        ),
        (
            "[8192,5000]",
            "trainer.branch_budgets[1]=5000: not a whole number of steps of trainer.global_batch_tokens=1024; "
            "use 4096 or 5120",
        ),
        ("[16384]", "trainer.branch_budgets[0]=16384: beyond this run's budget trainer.tokens=12288 (16 > 12 steps)"),
        ("[2048]", "trainer.branch_budgets[0]=2048: 2 steps, not more than optim.warmup_steps=2"),
        ("[0.5x]", "trainer.branch_budgets[0]: expected a count like 20M"),
    ],
)
def test_branch_budgets_are_checked_before_a_run_starts(budgets, said):
    from diffllm.budget import branch_points, plan_budget
    from diffllm.config import compose
    from diffllm.train.config import TrainConfig

    linear = ["optim.schedule=linear"] if "decay" in said else []
    with pytest.raises(ValueError) as e:
        cfg = TrainConfig.from_hydra(
            compose("train", [*WSD, f"trainer.tokens={PARENT}", *linear, f"trainer.branch_budgets={budgets}"])
        )
        branch_points(cfg.trainer.branch_budgets, cfg.optim, plan_budget(cfg.trainer, 64, 1))
    assert said in str(e.value), str(e.value)


def test_the_branch_points_are_the_decay_starts_of_the_budgets():
    from diffllm.budget import branch_points, plan_budget
    from diffllm.config import compose
    from diffllm.train.config import TrainConfig

    cfg = TrainConfig.from_hydra(
        compose(
            "train",
            [
                *WSD,
                "trainer.tokens=100K",
                "trainer.global_batch_tokens=1000",
                "trainer.micro_batch_size=1",
                "data.seq_len=100",
                "trainer.branch_budgets=[10K, 0.05M, 100000]",
            ],
        )
    )
    # decay over the last half (warmup 2): 10 steps -> from 5, 50 -> 25, 100 -> 50
    assert branch_points(cfg.trainer.branch_budgets, cfg.optim, plan_budget(cfg.trainer, 100, 1)) == {
        5: 10_000,
        25: 50_000,
        50: 100_000,
    }


@pytest.mark.slow
def test_a_refused_branch_is_one_line_on_the_command_line_and_writes_nothing(wsd, tmp_path):
    parent, _ = wsd(1)
    before = sorted((p.relative_to(parent), p.stat().st_mtime_ns) for p in parent.rglob("*"))
    done = diffllm_train(tmp_path, *branch_args(parent, tmp_path / "branch", "optim.lr=1e-3"))
    assert "optim.lr (0.003 -> 0.001) differs" in one_error_line(done)
    assert not (tmp_path / "branch").exists()
    assert sorted((p.relative_to(parent), p.stat().st_mtime_ns) for p in parent.rglob("*")) == before
    both = diffllm_train(tmp_path, *branch_args(parent, tmp_path / "branch", f"trainer.resume={parent}/checkpoints"))
    assert "trainer.branch_from: a branch starts from its parent's checkpoint, not trainer.resume=" in one_error_line(
        both
    )
