"""Run directories do not execute their pickles (issue 56): every checkpoint file diffllm reads, itself or through
DeepSpeed (zero_to_fp32, engine.load_checkpoint, ds_to_universal), is loaded weights-only with an allow-list of what
diffllm and DeepSpeed write. A copied run directory with a planted pickle (its payload would create a file) is refused
in one line naming the file or checkpoint and what the pickle calls, and the payload never runs."""

from __future__ import annotations

import os
import pickle
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from diffllm.errors import UserError
from diffllm.runfiles import refused, weights_only
from diffllm.runs import MODEL_STATES, Run
from diffllm.train.checkpoints.save import CheckpointManager
from tests.distributed import run_train
from tests.train.helpers import STEPS, tiny


class Payload:
    """What an attacker plants: unpickling it runs `touch <marker>`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plant(path: Path, marker: Path) -> None:
    """Rewrite checkpoint file `path` with the payload beside its real content (it still holds everything)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["note"] = Payload(marker)
    torch.save(state, path)


@pytest.fixture
def imported(tmp_path):
    """A run directory as `diffllm import` writes one (weights alone, DeepSpeed's ZeRO-0 layout), no training."""
    from diffllm.model import DecoderLM, ModelConfig

    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, vocab_size=256, max_seq_len=64)
    weights = DecoderLM(cfg).state_dict()
    Run(tmp_path / "run").write_weights(
        weights, {"step": 0, "tokens": 0, "world_size": 1, "zero_stage": 0, "model": asdict(cfg)}
    )
    return tmp_path / "run", weights


def test_a_planted_pickle_in_model_states_is_refused_and_never_runs(imported, tmp_path):
    run_dir, weights = imported
    _, model, _ = Run(run_dir).model(tokenizer=False)  # the honest file loads, weights-only
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    marker, states = tmp_path / "pwned", run_dir / "checkpoints" / "step0" / MODEL_STATES
    plant(states, marker)
    for read in (lambda: Run(run_dir).model(tokenizer=False), lambda: Run(run_dir).checkpoint().client_state()):
        with pytest.raises(UserError) as refused:
            read()
        line = str(refused.value)
        assert "\n" not in line and line.startswith(f"{states}: refused: its pickle calls posix.system,"), line
        assert not marker.exists()


def test_deepspeeds_loads_in_the_weights_only_block_refuse_a_planted_pickle(imported, tmp_path):
    """What DeepSpeed's loaders (engine.load_checkpoint, zero_to_fp32, ds_to_universal) run in: their own
    torch.load(weights_only=False) is made weights-only, with what DeepSpeed writes allowed."""
    run_dir, _ = imported
    marker, states = tmp_path / "pwned", run_dir / "checkpoints" / "step0" / MODEL_STATES
    with weights_only():
        assert "module" in torch.load(states, map_location="cpu", weights_only=False)  # an honest file: loaded
    plant(states, marker)
    with weights_only(), pytest.raises(pickle.UnpicklingError, match="GLOBAL posix.system"):
        torch.load(states, map_location="cpu", weights_only=False)
    assert not marker.exists() and refused(
        states, pickle.UnpicklingError("Weights only load failed. GLOBAL posix.system")
    )


@pytest.mark.slow
def test_a_planted_pickle_only_deepspeed_would_read_is_refused_on_every_rank(reference, tmp_path):
    """The 2-rank ZeRO-2 reference run, copied, with the payload in rank 1's optimizer states (which only DeepSpeed
    reads, on rank 1 alone): its weights gathered (zero_to_fp32) and a resume on 2 ranks refuse it in one line naming
    the file, on every rank alike (no rank goes on to lose its peer), before anything is loaded; DeepSpeed's universal
    conversion, in a process of its own, refuses it too. The marker never appears."""
    run_dir = shutil.copytree(reference(2), tmp_path / "copy")
    marker, ckpt = tmp_path / "pwned", run_dir / "checkpoints" / f"step{STEPS}"
    planted = ckpt / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    plant(planted, marker)
    refusal = f"{planted}: refused: its pickle calls posix.system, which no checkpoint of diffllm or DeepSpeed holds"
    shutil.rmtree(run_dir / "eval", ignore_errors=True)  # no fp32 cache from an earlier test: gathered now
    with pytest.raises(UserError, match=f"^{refusal}"):
        Run(run_dir).model(tokenizer=False)
    more = f"trainer.tokens={(STEPS + 2) * 1024}"  # past the finished run's budget: its checkpoint is loaded
    two = run_train(tiny(run_dir, 2, more, workers=True), 2, tmp_path / "logs", expect=2)
    for rank in (0, 1):
        errors = [line for line in two.output(rank).splitlines() if "error" in line]
        assert errors == [f"diffllm train: error: {errors[0].split('error: ', 1)[1]}"], errors
        assert refusal in errors[0] and "resumed" not in two.output(rank), two.output(rank)
    with pytest.raises(UserError, match=f"^{ckpt}: refused: its pickle calls posix.system,"):
        CheckpointManager.to_universal(Run(run_dir).checkpoint())  # as if no check had looked before it
    assert not marker.exists() and not (run_dir / "checkpoints" / f"step{STEPS}_universal").exists()
