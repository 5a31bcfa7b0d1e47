"""Bad input to `diffllm train` is refused before the first write into the run directory (issue 31): one line naming
the culprit, exit code 2, and the run directory byte for byte as it was (or never created). The run they relaunch
stopped short of its budget: 8 steps asked, a non-finite step 6 ended it (exit 4) after the step-5 checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.train.helpers import TINY, unwritable
from tests.train.test_cli import diffllm_train
from tests.train.test_run_dir import listing, one_error_line, snapshot

pytestmark = pytest.mark.slow
ARGS = [a for a in TINY if not a.startswith(("trainer.tokens=", "trainer.save_every_steps="))] + [
    "trainer.tokens=8192",
    "trainer.save_every_steps=5",
]


@pytest.fixture(scope="module")
def stopped(tokenizer, tmp_path_factory) -> Path:
    """A run of 8 steps stopped at step 6 (a NaN loss, trainer.max_nonfinite_in_a_row=1): its latest checkpoint is
    step 5 (5,120 tokens), no summary.json."""
    root = tmp_path_factory.mktemp("stopped")
    nan = ["trainer.faults.nan_at_steps=[6]", "trainer.max_nonfinite_in_a_row=1"]
    done = diffllm_train(root, *ARGS, *nan, f"run_dir={root / 'run'}")
    assert done.returncode == 4, done.stdout + done.stderr
    assert (root / "run" / "checkpoints" / "latest").read_text() == "step5"
    return root / "run"


@pytest.fixture
def run_dir(stopped, tmp_path) -> Path:
    shutil.copytree(stopped, tmp_path / "run")
    return tmp_path / "run"


def test_a_read_only_run_dir_is_one_line_naming_it(run_dir, tmp_path):
    """Issue 31 defect 4: resuming into a run_dir that cannot be written was a 52-line traceback ending in
    PermissionError on .tokenizer.json.tmp; a new run_dir under a read-only folder is the same one line."""
    before, content = listing(run_dir), snapshot(run_dir)
    with unwritable(run_dir):
        line = one_error_line(diffllm_train(tmp_path, *ARGS, f"run_dir={run_dir}"))
    assert line == (
        f"diffllm train: error: run_dir={run_dir}: {run_dir} is not writable (permission denied); use another run_dir"
    )
    assert listing(run_dir) == before and snapshot(run_dir) == content

    parent = tmp_path / "parent"
    parent.mkdir()
    with unwritable(parent):
        line = one_error_line(diffllm_train(tmp_path, *ARGS, f"run_dir={parent / 'a' / 'new'}"))
    assert line == (
        f"diffllm train: error: run_dir={parent / 'a' / 'new'}: cannot create it ({parent} is not writable: "
        f"permission denied)"
    )
    assert list(parent.iterdir()) == []


EVAL_TEXT_64 = ["trainer.eval.at_end=true", "trainer.eval.needle_mode=text", "trainer.eval.needle_n=[1]"]


@pytest.mark.parametrize(
    "bad, culprit",
    [
        (["data.seq_len=128", "model.max_seq_len=64"], "data.seq_len=128: longer than model.max_seq_len=64"),
        (["trainer.resume=none", "data.sources.0.path=/nonexistent/x.txt"], "/nonexistent/x.txt: no such file"),
        ([*EVAL_TEXT_64, "trainer.eval.needle_length=64"], "trainer.eval.needle_length=64: 64 tokens cannot hold"),
    ],
    ids=["seq-len-beyond-the-model", "fresh-start-with-missing-data", "eval-prompts-that-cannot-be-built"],
)
def test_bad_input_leaves_the_run_dir_as_it_was(run_dir, tmp_path, bad, culprit):
    """Issue 31 defect 6: data.seq_len above model.max_seq_len was refused only after config.yaml and tokenizer.json
    were written (and a fresh start moved the old run aside before its data was checked). Each bad input is one line,
    the used run_dir unchanged byte for byte (and mtime for mtime), and a new run_dir never created."""
    before, content = listing(run_dir), snapshot(run_dir)
    line = one_error_line(diffllm_train(tmp_path, *ARGS, *bad, f"run_dir={run_dir}"))
    assert culprit in line, line
    assert listing(run_dir) == before and snapshot(run_dir) == content
    new = tmp_path / "runs" / "new"
    assert culprit in one_error_line(diffllm_train(tmp_path, *ARGS, *bad, f"run_dir={new}"))
    assert not (tmp_path / "runs").exists()


def test_a_budget_below_the_checkpoint_is_refused(run_dir, tmp_path):
    """Issue 31 defect 5: relaunched with a budget below its checkpoint's step (5 steps = 5,120 tokens done, 4,096
    asked), the run 'finished' at 5,120 tokens, above its budget. Refused in one line naming the key, both numbers."""
    before, content = listing(run_dir), snapshot(run_dir)
    line = one_error_line(diffllm_train(tmp_path, *ARGS, "trainer.tokens=4096", f"run_dir={run_dir}"))
    assert line == (
        f"diffllm train: error: trainer.tokens=4096: a budget of 4,096 tokens, below the 5,120 tokens that the "
        f"checkpoint {run_dir}/checkpoints/step5 has trained (step 5); use trainer.tokens=5120 or more, or "
        f"trainer.resume=none to start afresh"
    )
    assert listing(run_dir) == before and snapshot(run_dir) == content


KEEPS = "a resumed run keeps its optimisation schedule: relaunch with the checkpoint's values, or add "


@pytest.mark.parametrize(
    "change, shown",
    [
        (["trainer.tokens=10240"], "trainer.tokens (8192 -> 10240)"),
        (
            ["optim.schedule=cosine", "optim.warmup_steps=2"],
            "optim.schedule ('linear' -> 'cosine'); optim.warmup_steps (4 -> 2)",
        ),
        (
            ["optim.min_lr=0.0", "trainer.global_batch_tokens=2048"],
            "optim.min_lr (0.0003 -> 0.0); trainer.global_batch_tokens (1024 -> 2048)",
        ),
    ],
)
def test_a_changed_schedule_is_refused_on_resume(run_dir, tmp_path, change, shown):
    """Issue 31 (frictions): a changed lr or budget on the resume of an unfinished run was a note; the optimisation
    schedule (every optim key, the budget, the batch) is now changed only with trainer.allow_changes=true."""
    before, content = listing(run_dir), snapshot(run_dir)
    line = one_error_line(diffllm_train(tmp_path, *ARGS, *change, f"run_dir={run_dir}"))
    ckpt = run_dir / "checkpoints" / "step5"
    assert line == (
        f"diffllm train: error: {shown}: changed since the checkpoint {ckpt}; {KEEPS}trainer.allow_changes=true to "
        f"continue with the new ones"
    )
    assert listing(run_dir) == before and snapshot(run_dir) == content


def test_allow_changes_continues_with_the_new_schedule(run_dir, tmp_path):
    """The same count written otherwise (8.192K) is no change; another lr is, and trainer.allow_changes=true takes
    it."""
    line = one_error_line(
        diffllm_train(tmp_path, *ARGS, "trainer.tokens=8.192K", "optim.lr=1e-3", f"run_dir={run_dir}")
    )
    assert line.startswith("diffllm train: error: optim.lr (0.003 -> 0.001): changed since the checkpoint"), line
    done = diffllm_train(tmp_path, *ARGS, "optim.lr=1e-3", "trainer.allow_changes=true", f"run_dir={run_dir}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "note: optim.lr (0.003 -> 0.001) since the checkpoint (trainer.allow_changes=true): the run continues with "
        "the new value" in done.stdout
    ), done.stdout
    assert f"resumed from checkpoint {run_dir}/checkpoints/step5" in done.stdout, done.stdout
    assert "finished: 8,192 tokens" in done.stdout, done.stdout
