"""A config saved by an earlier diffllm lacks the keys added since: a finished run's relaunch, a resumed run's
schedule and a branch's parent compare it with each missing key read as its default (the behaviour before the key),
so an upgrade is no change, while a new key set otherwise than its default still is."""

from __future__ import annotations

import copy

import pytest

from diffllm.config import compose
from diffllm.errors import UserError
from diffllm.runs import Run
from diffllm.train.checkpoints.plan import changed_keys, check_finished_unchanged, check_prefix, filled
from diffllm.train.config import TrainConfig


def train_config(*overrides: str) -> TrainConfig:
    return TrainConfig.from_hydra(compose("train", ["model=diff-tiny", *overrides]))


def older(resolved: dict) -> dict:
    """`resolved` as an earlier diffllm saved it: without model.lambda_mup_scale and trainer.val_batches."""
    saved = copy.deepcopy(resolved)
    del saved["model"]["lambda_mup_scale"], saved["trainer"]["val_batches"]
    return saved


def test_keys_added_since_read_as_their_defaults():
    cfg = train_config()
    saved = older(cfg.resolved)
    assert len(changed_keys(saved, cfg.resolved, ())) == 2  # compared raw, each missing key is a change
    assert changed_keys(filled(saved, cfg), cfg.resolved, ()) == []
    check_finished_unchanged(Run("runs/x"), saved, cfg)  # no error
    check_prefix(saved, cfg, "runs/parent")


def test_a_new_key_set_otherwise_is_still_a_change():
    saved = older(train_config().resolved)
    cfg = train_config("model.lambda_mup_scale=true")
    assert changed_keys(filled(saved, cfg), cfg.resolved, ()) == ["model.lambda_mup_scale (False -> True)"]
    with pytest.raises(UserError, match=r"holds a finished run .*model.lambda_mup_scale \(False -> True\)"):
        check_finished_unchanged(Run("runs/x"), saved, cfg)
    with pytest.raises(UserError, match=r"model.lambda_mup_scale \(False -> True\) differs from the parent"):
        check_prefix(saved, cfg, "runs/parent")
