"""Every file in scripts/ runs, so that a change in the package that breaks one fails CI: each benchmark on tiny
settings (one process of `bench_all.py --smoke` runs all three and prints their tables and the summary), the
plays_cloze task writer (byte-identical to the shipped task), the SLURM example
(what `diffllm launch` writes) and the test repeater. Each test asserts the rows of the table its script prints. The GPU
check (gpu_check*.py, gpu_bench_attention.py, gpu_wheels.sh) runs on the simulated GPU image:
tests/scripts/test_gpu_check_image.py."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
TESTED = {
    "bench_all.py",
    "bench_data.py",
    "bench_train.py",
    "bench_generate.py",  # tests/scripts/test_bench_generate.py
    "bench_eval.py",
    "bench_loss_head.py",  # test_bench_loss_head_prints_the_chunked_bytes below, and in bench_all's summary
    "bench_counts.py",  # bench_all's smoke run (its summary rows below); tests/train/test_counts.py asserts the counts
    "gpu_check.sh",  # tests/scripts/test_gpu_check_image.py, with the four below
    "gpu_check.py",
    "gpu_check_trainer.py",
    "gpu_check_docmask.py",
    "gpu_bench_attention.py",
    "gpu_wheels.sh",
    "get_corpus.py",  # tests/data/test_corpus.py (no download in CI; make corpus runs it)
    "make_plays_cloze.py",
    "train.sbatch",
    "repeat_tests.sh",
    "hostfile.example",
    "host_speed.py",  # make test and make test-slow print it first; test_host_speed_is_one_line below
}  # hostfile.example: the format docs/launch.md shows, read by tests/launch


def env() -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "WANDB_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def test_every_script_has_a_smoke_test():
    assert {p.name for p in SCRIPTS.iterdir() if p.is_file()} == TESTED


def table_rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of every markdown table row whose first cell is `first_cell`."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")
    ]
    return [r for r in rows if r[0] == first_cell]


# Every test of `bench` is slow-marked, so its fixture (35 s) is paid once, in make test-slow, not in make test too.
bench_smoke = pytest.mark.slow


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> str:
    """The output of `bench_all.py --smoke`: the three benchmarks' tables, then the summary."""
    res = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_all.py"), "--smoke"],
        capture_output=True,
        text=True,
        env=env(),
        cwd=tmp_path_factory.mktemp("bench"),
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def section(out: str, script: str) -> str:
    return out.split(f"## {script}\n", 1)[1].split("\n## ", 1)[0].split("\n# diffllm benchmark summary", 1)[0]


@bench_smoke
def test_bench_data_prints_every_process_layout_and_the_training_line(bench):
    out = section(bench, "bench_data.py")
    for label in ("1", "2: 2 ranks", "2: 1 rank, 2 workers"):
        (row,) = table_rows(out, label)
        assert len(row) == 9 and int(row[2].replace(",", "")) > 0, row  # pipeline tokens/s measured
    assert re.search(r"1-process pipeline / training consumption: [\d,.]+x", out)


@bench_smoke
def test_bench_train_prints_each_loop_and_the_per_flop_table(bench):
    out = section(bench, "bench_train.py")
    for preset in ("transformer-micro-1", "diff-micro-1", "diff2-micro-1"):
        loops = {r[1] for r in table_rows(out, preset) if len(r) == 8}
        assert loops == {"bare torch AdamW", "diffllm ZeRO-2", "diffllm ZeRO-0"}, loops
        (flop,) = [r for r in table_rows(out, preset) if len(r) == 5]
        assert float(flop[1]) > 0
    (base,) = [r for r in table_rows(out, "transformer-micro-1") if len(r) == 5]
    assert base[1] == "1.000"


@bench_smoke
def test_bench_eval_prints_train_and_eval_rows(bench):
    out = section(bench, "bench_eval.py")
    assert table_rows(out, "train step (fwd+bwd+AdamW)")[0][2] == "1.00x"
    assert float(table_rows(out, "eval ppl, batch 4")[0][2].rstrip("x")) > 0


@bench_smoke
def test_bench_all_prints_the_summary_table(bench):
    out = bench.split("# diffllm benchmark summary", 1)[1]
    assert "machine: " in out and "command: " in out
    names = [line.strip("|").split("|")[0].strip() for line in out.splitlines() if line.startswith("| ")]
    for name in (
        "framework / bare step, ZeRO-0",
        "framework / bare step, ZeRO-2",
        "diff-micro-1 step time / FLOP ratio to transformer-micro-1",
        "diff2-micro-1 step time / FLOP ratio to transformer-micro-1",
        "eval / training step (diff-micro-1)",
        "data pipeline / raw tokenizer, processes 1",
        "data pipeline / raw tokenizer, processes 2: 2 ranks",
        "data pipeline / training consumption",
        "host syncs per plain step, ZeRO-2, 2 ranks",
        "host syncs per logged step, ZeRO-2, 2 ranks",
        "collectives per plain step, ZeRO-2, 2 ranks",
        "collectives per logged step, ZeRO-2, 2 ranks",
        "loss head saved bytes, chunked / full logits",
        "loss head peak bytes, chunked / full logits",
    ):
        assert name in names, (name, names)
    saved = next(line for line in out.splitlines() if line.startswith("| loss head saved bytes"))
    assert 0 < float(saved.split("|")[2].rsplit(":", 1)[1]) <= 0.25, saved  # issue 52: at most a quarter


def test_make_plays_cloze_writes_the_shipped_task(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_plays_cloze", SCRIPTS / "make_plays_cloze.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    shipped = mod.OUT.read_bytes()
    monkeypatch.setattr(mod, "OUT", tmp_path / "plays_cloze.jsonl")
    mod.main()
    assert (tmp_path / "plays_cloze.jsonl").read_bytes() == shipped


def test_train_sbatch_is_what_diffllm_launch_writes(tmp_path):
    cmd = [
        "launch",
        "--launcher",
        "slurm",
        "--nodes",
        "2",
        "--procs",
        "8",
        "--partition",
        "gpu",
        "--account",
        "YOUR_ACCOUNT",
        "--time",
        "48:00:00",
        "--setup",
        "source .venv/bin/activate",
        "--env",
        "NCCL_DEBUG=WARN",
        "--script",
        "train.sbatch",
        "--submit",
        "false",
        "model=diff-830m",
        "trainer=paper-scaling",
        "optim=paper-scaling",
    ]  # the command docs/launch.md gives for it
    res = subprocess.run(
        [sys.executable, "-m", "diffllm.cli", *cmd],
        capture_output=True,
        text=True,
        env=env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    written = (tmp_path / "train.sbatch").read_text().replace(str(tmp_path), "/path/to/diffllm")
    written = written.replace(str(Path(sys.executable).parent.parent), "/path/to/diffllm/.venv")
    assert written == (SCRIPTS / "train.sbatch").read_text()


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_repeat_tests_counts_passes_and_failures(tmp_path):
    (tmp_path / "test_one.py").write_text("import os\n\ndef test_one():\n    assert not os.environ.get('FAIL')\n")
    run = lambda fail: subprocess.run(  # noqa: E731
        ["bash", str(SCRIPTS / "repeat_tests.sh"), "2", "-l", str(tmp_path / "logs"), "--", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**env(), "PYTHON": sys.executable, **({"FAIL": "1"} if fail else {})},
    )
    good, bad = run(False), run(True)
    assert good.returncode == 0 and "passed 2, failed 0 of 2 runs" in good.stdout, good.stdout
    assert bad.returncode == 1 and "passed 0, failed 2 of 2 runs" in bad.stdout, bad.stdout


def test_bench_loss_head_prints_the_chunked_bytes():
    """At vocab 50K, 2 x 2048 tokens (meta device, seconds) the chunked head saves a fraction of the full logits."""
    args = ["--vocab", "50304", "--d-model", "256", "--seq-len", "2048", "--micro-batch", "2"]
    res = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_loss_head.py"), *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    (row,) = [line.split("|") for line in res.stdout.splitlines() if line.strip().startswith("50,304")]
    vocab, d_model, chunks, _, per_chunk = row[0].split()
    assert int(chunks) > 1 and float(row[1].split()[-1]) < 0.25, res.stdout  # several chunks, under 1/4 the bytes


def test_host_speed_is_one_line(capsys, monkeypatch):
    """scripts/host_speed.py (make test and make test-slow print it first): one line with both rates, the cores and
    the load; measured here on small sizes."""
    import functools

    spec = importlib.util.spec_from_file_location("host_speed", SCRIPTS / "host_speed.py")
    host_speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_speed)
    monkeypatch.setattr(host_speed, "loop_rate", functools.partial(host_speed.loop_rate, 20_000))
    monkeypatch.setattr(host_speed, "matmul_rate", functools.partial(host_speed.matmul_rate, 32, 2))
    host_speed.main()
    line = capsys.readouterr().out
    assert re.fullmatch(
        r"host: python \d+\.\d M loop steps/s, torch fp32 matmul \d+\.\d GFLOP/s \(1 thread\), \d+ cores, "
        r"load \d+\.\d\d \(1 min\)\n",
        line,
    ), line
