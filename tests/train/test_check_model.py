"""A resumed run's architecture check (diffllm/train/checkpoints/plan.py check_model) on checkpoints' meta.json model
sections: a key that ModelConfig gained after a checkpoint was saved reads as its default, so runs saved before it
resume."""

from dataclasses import asdict
from pathlib import Path

import pytest

from diffllm.errors import UserError
from diffllm.model import ModelConfig
from diffllm.runfiles import Checkpoint
from diffllm.train.checkpoints.plan import check_model

CFG = dict(arch="diff", d_model=32, n_layers=2, n_heads=4, vocab_size=512, max_seq_len=256)


def checkpoint(model: dict) -> Checkpoint:
    return Checkpoint(Path("/nonexistent/checkpoints"), "step415", {"model": model})


def saved_before(key: str) -> dict:
    """The model section a checkpoint saved before ModelConfig had `key`."""
    model = asdict(ModelConfig(**CFG))
    del model[key]
    return model


def test_a_key_added_after_the_checkpoint_reads_as_its_default():
    check_model(checkpoint(saved_before("parametrization")), ModelConfig(**CFG))  # sp: the behaviour before the key


def test_a_key_added_after_the_checkpoint_is_still_checked_against_its_default():
    with pytest.raises(UserError, match=r"model.parametrization: the checkpoint .*step415 has 'sp', this run 'mup'"):
        check_model(checkpoint(saved_before("parametrization")), ModelConfig(**CFG, parametrization="mup"))


def test_a_saved_key_that_differs_is_refused():
    with pytest.raises(UserError, match=r"model.d_model: the checkpoint .* has 32, this run 48"):
        check_model(checkpoint(asdict(ModelConfig(**CFG))), ModelConfig(**{**CFG, "d_model": 48}))
