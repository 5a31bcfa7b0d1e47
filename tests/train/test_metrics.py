"""MFU against dense bf16 peaks looked up by device name (n/a on CPU), the progress line, metrics.jsonl, W&B mode."""

from __future__ import annotations

import json

import pytest

from diffllm.runs import read_metrics
from diffllm.train.config import LoggingConfig
from diffllm.train.metrics import MetricsLog, mfu, peak_tflops, progress_line
from diffllm.train.tracking import wandb_mode


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA A100-PCIE-40GB", 312),
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA H200", 989),
        ("NVIDIA GH200 480GB", 989),
        ("NVIDIA B200", 2250),
        ("cpu", None),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_dense_bf16_peak_by_device_name(name, peak):
    assert peak_tflops(name) == peak


def test_mfu_is_model_flops_over_peak_and_na_without_a_peak():
    # 40,000 tokens/s/GPU of a model with 6 x 1.3e9 = 7.8e9 FLOPs/token on an H100: 312 TFLOP/s = 31.5%
    assert mfu(40_000, 7.8e9, 989.0) == pytest.approx(312e12 / 989e12)
    assert mfu(40_000, 7.8e9, None) is None


def test_progress_line_has_every_field():
    rec = {
        "step": 12,
        "tokens": 98_304,
        "loss": 5.4321,
        "lr": 3e-4,
        "grad_norm": 0.75,
        "tokens_per_s": 41_200.0,
        "mfu": None,
        "skipped_steps": 0,
    }
    line = progress_line(rec, 200, 1_638_400, 151)
    assert line == (
        "step 12/200 | tokens 98.3K/1.6M | loss 5.4321 | lr 3.000e-04 | gnorm 0.750 | 41.2K tok/s | MFU n/a | ETA 2m31s"
    )
    rec.update(loss=None, mfu=0.4123, skipped_steps=2)
    assert "loss nan" in progress_line(rec, 200, 1_638_400, 0) and "MFU 41.2%" in progress_line(rec, 200, 1, 0)
    assert progress_line(rec, 200, 1, 0).endswith("| skipped 2")


def test_metrics_log_truncates_after_a_resume_step(tmp_path):
    log = MetricsLog(tmp_path)
    for s in range(1, 7):
        log.write({"step": s, "loss": 1.0 / s})
    log.write({"step": 6, "val_loss": 0.5})
    assert log.truncate_after(4) == 3
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert all(json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())


def test_a_last_line_cut_short_by_a_kill_is_left_out_and_dropped_on_resume(tmp_path):
    """A kill during the append leaves half a record at the end: readers (sweep collect, scaling, tests polling a live
    run) skip it, and the resume's truncation removes it, so that the next record does not land after it."""
    log = MetricsLog(tmp_path)
    for s in range(1, 4):
        log.write({"step": s, "loss": 1.0 / s})
    path = tmp_path / "metrics.jsonl"
    whole = path.read_text()
    path.write_text(whole + '{"step": 4, "lo')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert log.truncate_after(3) == 0
    assert path.read_text() == whole
    log.write({"step": 4, "loss": 0.25})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]


def test_a_damaged_line_inside_metrics_is_a_one_line_error(tmp_path):
    """Only the last line can be cut short by a kill; a bad line before it is damage, not to be skipped silently."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not valid JSON") as err:
        read_metrics(tmp_path)
    assert "\n" not in str(err.value)


def test_wandb_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert wandb_mode(LoggingConfig()) == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode(LoggingConfig()) == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode(LoggingConfig()) == "disabled"
    assert wandb_mode(LoggingConfig(wandb="offline")) == "offline"
