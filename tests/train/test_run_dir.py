"""The run directory as `diffllm train` leaves it (issue 11): self-contained (config.yaml + tokenizer.json), a finished
result that relaunching never rewrites, no mixing of two runs, one-line errors for damaged pieces, and notes where the
run differs from what was asked (a rounded budget, a warmup longer than the run)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from diffllm.runs import Run
from tests.distributed import run_train
from tests.train.helpers import TINY, unwritable
from tests.train.test_cli import diffllm_train

pytestmark = pytest.mark.slow
ARGS = [a for a in TINY if not a.startswith(("trainer.tokens=", "optim.warmup_steps="))] + [
    "trainer.tokens=4000",
    "trainer.round_tokens=true",
    "optim.warmup_steps=8",
    "trainer.log_every=2",
]


def one_error_line(done) -> str:
    """Exit code 2 and exactly one `diffllm train: error:` line on stderr, no traceback."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("diffllm train: error: "), done.stderr
    return errors[0]


def snapshot(run_dir) -> dict:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def listing(run_dir) -> dict:
    """Every path under run_dir (folders too) with its mtime and size: a new, removed or rewritten entry shows."""
    return {
        p.relative_to(run_dir).as_posix(): (p.is_dir(), p.stat().st_mtime_ns, p.stat().st_size)
        for p in [run_dir, *sorted(run_dir.rglob("*"))]
    }


@pytest.fixture(scope="module")
def finished(tokenizer, tmp_path_factory):
    """A finished 4-step run: 4000 tokens asked, rounded to 4096; warmup 8 steps > 4; (run_dir, its output)."""
    root = tmp_path_factory.mktemp("finished")
    done = diffllm_train(root, *ARGS, f"run_dir={root / 'run'}")
    assert done.returncode == 0, done.stdout + done.stderr
    return root / "run", done


def copy_of(finished, tmp_path, name="copy"):
    shutil.copytree(finished[0], tmp_path / name)
    return tmp_path / name


def test_a_new_run_is_self_contained_and_says_what_differs_from_the_request(finished, tokenizer, tmp_path):
    run_dir, done = finished
    assert (
        "note: trainer.tokens=4000 rounded up to 4096 = 4 whole steps of 1024 tokens (trainer.round_tokens=true)"
        in done.stdout
    )
    assert "warning: the run has 4 steps and optim.warmup_steps=8" in done.stderr
    assert json.loads((run_dir / "summary.json").read_text())["tokens"] == 4096
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["data"]["tokenizer"]["path"] == str(run_dir / "tokenizer.json") and config["data"]["seq_len"] == 64
    moved = shutil.move(str(run_dir), str(tmp_path / "elsewhere"))  # another machine: no tokenizer cache needed
    try:
        cfg, model, tok = Run(moved).model()
        assert tok.fingerprint == tokenizer.fingerprint and tok.decode(tok.encode("To be, or not")) == "To be, or not"
        assert cfg.vocab_size == tokenizer.vocab_size
    finally:
        shutil.move(moved, str(run_dir))
    records = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert [r["step"] for r in records] == [2, 4]
    assert all(r["time"] > 1.7e9 and 0 < r["elapsed_s"] and r["loss_mean"] is not None for r in records)
    assert records[0]["elapsed_s"] < records[1]["elapsed_s"]


def test_relaunching_a_finished_run_never_rewrites_its_result(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    before = snapshot(run_dir)
    same = diffllm_train(tmp_path, *ARGS, f"run_dir={run_dir}")
    assert same.returncode == 0 and "already at its budget" in same.stdout, same.stdout + same.stderr
    assert snapshot(run_dir) == before
    changed = diffllm_train(tmp_path, *ARGS, f"run_dir={run_dir}", "data.seq_len=128")
    line = one_error_line(changed)
    assert f"run_dir={run_dir} holds a finished run" in line and "data.seq_len (64 -> 128)" in line, line
    assert snapshot(run_dir) == before
    # what only says how to run or watch it (evaluation, watchdogs) is not a change of the run
    watched = diffllm_train(
        tmp_path,
        *ARGS,
        f"run_dir={run_dir}",
        "trainer.eval.every=4",
        "trainer.eval.needle_n=[1]",
        "trainer.stall_timeout_s=60",
        "data.worker_timeout_s=60",
    )
    assert watched.returncode == 0 and "already at its budget" in watched.stdout, watched.stdout + watched.stderr
    assert snapshot(run_dir) == before
    with unwritable(run_dir):  # nothing is written to a finished run: a read-only one is no error (issue 31)
        readonly = diffllm_train(tmp_path, *ARGS, f"run_dir={run_dir}")
    assert readonly.returncode == 0 and "already at its budget" in readonly.stdout, readonly.stdout + readonly.stderr


def test_another_runs_checkpoint_is_refused_in_a_used_run_dir_and_continues_in_a_new_one(finished, tmp_path):
    ckpt = finished[0] / "checkpoints" / "step4"
    used = copy_of(finished, tmp_path, "used")
    before = snapshot(used)
    refused = diffllm_train(tmp_path, *ARGS, f"run_dir={used}", f"trainer.resume={ckpt}")
    line = one_error_line(refused)
    assert f"run_dir={used} already holds another run (checkpoints, metrics.jsonl, summary.json" in line, line
    assert snapshot(used) == before

    new = tmp_path / "new"  # a new run from the checkpoint, on a machine without the tokenizer cache: 4 -> 8 steps
    args = [*ARGS, f"run_dir={new}", f"trainer.resume={ckpt}", "trainer.tokens=8192"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIFFLLM_CACHE", str(tmp_path / "empty-cache"))
        cont = diffllm_train(tmp_path, *args)
    assert cont.returncode == 0, cont.stdout + cont.stderr
    assert "training a byte-level BPE" not in cont.stdout + cont.stderr
    assert f"resumed from checkpoint {ckpt}" in cont.stdout
    assert (new / "tokenizer.json").read_bytes() == (finished[0] / "tokenizer.json").read_bytes()
    assert [json.loads(x)["step"] for x in (new / "metrics.jsonl").read_text().splitlines()] == [6, 8, 8]
    again = diffllm_train(tmp_path, *args)  # the same command again continues its own run, not the other one
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{new}/checkpoints/step8: the finished run's last checkpoint (step 8" in again.stdout
    assert "already at its budget" in again.stdout


def test_damaged_run_dirs_are_one_line_errors(finished, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert f"{a_file}: is a file, not a run directory" in one_error_line(
        diffllm_train(tmp_path, *ARGS, f"run_dir={a_file}")
    )

    states = copy_of(finished, tmp_path, "states")
    (states / "checkpoints" / "step4" / "mp_rank_00_model_states.pt").write_bytes(b"\x00garbage" * 100)
    line = one_error_line(diffllm_train(tmp_path, *ARGS, f"run_dir={states}"))
    assert f"{states}/checkpoints/step4: cannot load this checkpoint" in line and "damaged" in line, line

    cut = copy_of(finished, tmp_path, "cut")  # a file cut short: torch's message is long; the line ends at a sentence
    shard = cut / "checkpoints" / "step4" / "mp_rank_00_model_states.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    line = one_error_line(diffllm_train(tmp_path, *ARGS, f"run_dir={cut}"))
    assert f"{cut}/checkpoints/step4: cannot load this checkpoint (RuntimeError: PytorchStreamReader" in line, line
    assert re.search(r"\(RuntimeError: [^()]*\.\); the checkpoint is damaged: resume an earlier one", line), line

    meta = copy_of(finished, tmp_path, "meta")
    (meta / "checkpoints" / "step4" / "meta.json").write_text("{garbage")
    line = one_error_line(diffllm_train(tmp_path, *ARGS, f"run_dir={meta}"))
    assert f"{meta}/checkpoints/step4/meta.json: not valid JSON" in line, line


def test_a_resumed_run_refuses_another_tokenizer(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    line = one_error_line(
        diffllm_train(tmp_path, *ARGS, f"run_dir={run_dir}", "trainer.tokens=8192", "data.tokenizer.vocab_size=512")
    )
    assert "data.tokenizer: this run was trained with another tokenizer (vocab_size (1024 -> 512))" in line, line


def test_a_finished_run_relaunched_on_two_ranks_stays_untouched(finished, tmp_path):
    """Issue 20: `torchrun --nproc_per_node 2` after a 1-rank run converted its finished checkpoint to a universal one
    (writing into the run) and then died on the data state; a finished run is final at any world size."""
    run_dir = copy_of(finished, tmp_path)
    before, content = listing(run_dir), snapshot(run_dir)
    again = run_train([*ARGS, f"run_dir={run_dir}"], 2, tmp_path / "logs")
    assert "already at its budget" in again.output(0), again.output(0)
    assert "universal" not in again.output(0) and "Traceback" not in again.output(0) + again.output(1)
    assert listing(run_dir) == before and snapshot(run_dir) == content


def test_a_world_size_the_data_state_cannot_take_is_one_line_before_anything_is_written(finished, tmp_path):
    """A 1-rank run (1 data stream) continued on 2 ranks: one line naming the problem and the way out, exit 2 on every
    rank, and the run directory exactly as it was (no universal conversion)."""
    run_dir = copy_of(finished, tmp_path)
    before, content = listing(run_dir), snapshot(run_dir)
    more = run_train([*ARGS, f"run_dir={run_dir}", "trainer.tokens=8192"], 2, tmp_path / "logs", expect=2)
    for rank in (0, 1):
        out = more.output(rank)
        assert "Traceback" not in out and "universal" not in out, out
        errors = [line for line in out.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and errors[0].startswith(f"diffllm train: error: {run_dir}/checkpoints/step"), out
        assert ": data state has 1 streams" in errors[0], errors[0]  # after the checkpoint it comes from
        assert "must divide 1" in errors[0] and "data.resume=false" in errors[0], errors[0]
    assert listing(run_dir) == before and snapshot(run_dir) == content


@pytest.mark.parametrize("missing", ["data.val.0.path", "data.sources.0.path"])
def test_a_data_error_leaves_no_run_dir_behind(tokenizer, tmp_path, missing):
    """Inputs are checked before run_dir is created: a data config naming a file that does not exist is one line and
    exit 2, and there is no (empty) run directory afterwards."""
    run_dir = tmp_path / "runs" / "new"
    line = one_error_line(diffllm_train(tmp_path, *ARGS, f"run_dir={run_dir}", f"{missing}=/nonexistent/x.txt"))
    assert "/nonexistent/x.txt: no such file" in line, line
    assert not (tmp_path / "runs").exists(), list((tmp_path / "runs").rglob("*"))
