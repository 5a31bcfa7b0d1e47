"""Every field of a command's typed configs exists in its composed config at the dataclass default (the YAML merged
over it), so documented keys are set by their plain name, without `+`; `build` runs each config's validate()."""

from __future__ import annotations

import dataclasses

import pytest

from diffllm.cli.registry import COMMANDS
from diffllm.config import build, compose, schema_for
from diffllm.data.config import DataConfig, SourceConfig
from diffllm.model.config import ModelConfig
from diffllm.model.diff_attention import lambda_init_at
from diffllm.train.config import TrainerConfig


@pytest.mark.parametrize(
    "override, typed, group, check",
    [
        ("model.lambda_init=0.5", ModelConfig, "model", lambda c: c.lambda_init == 0.5 and lambda_init_at(c, 7) == 0.5),
        ("model.attn_backend=eager", ModelConfig, "model", lambda c: c.attn_backend == "eager"),
        ("data.tokenizer.min_frequency=5", DataConfig, "data", lambda c: c.tokenizer.min_frequency == 5),
        ("data.tokenize_chars=4096", DataConfig, "data", lambda c: c.tokenize_chars == 4096),
        (
            "data.prepared_dir=prepared/shakespeare",
            DataConfig,
            "data",
            lambda c: c.prepared_dir == "prepared/shakespeare",
        ),
    ],
)
def test_documented_keys_without_plus(override, typed, group, check):
    cfg = compose("train", [override])
    assert check(build(typed, cfg[group], group))
    default = build(typed, compose("train")[group], group)
    assert not check(default)  # the override made the difference


@pytest.mark.parametrize("name", sorted({c.config for c in COMMANDS.values() if c.config}))
def test_every_dataclass_field_is_in_the_composed_config(name):
    """Fields added to a dataclass later show up by themselves: nothing is listed by hand."""
    cfg = compose(name)
    for group, cls in schema_for(name).items():
        node = cfg[group] if group else cfg
        assert {f.name for f in dataclasses.fields(cls)} <= set(node.keys()), (name, group)
        build(cls, node if group else {k: node[k] for k in (f.name for f in dataclasses.fields(cls))}, group)


def test_yaml_values_win_over_dataclass_defaults():
    cfg = compose("train")
    assert (
        cfg.model.rope_interleaved is True and ModelConfig().rope_interleaved is False
    )  # configs/model/diff-tiny.yaml
    assert cfg.trainer.tokens == 524288 and cfg.model.vocab_multiple == 64  # YAML; dataclass default (not in YAML)


def test_build_runs_validate():
    with pytest.raises(ValueError, match=r"^trainer\.zero_stage: got 4"):
        build(TrainerConfig, {"zero_stage": 4}, "trainer")
    with pytest.raises(ValueError, match=r"^data\.sources\[0\]\.format: got 'csv'"):
        build(SourceConfig, {"path": "a.csv", "format": "csv"}, "data.sources[0]")  # validate(where) gets the prefix


def test_build_unknown_key_suggests():
    with pytest.raises(ValueError, match=r"^trainer\.zero_stag: unknown key \(did you mean trainer\.zero_stage\?\)"):
        build(TrainerConfig, {"zero_stag": 2}, "trainer")
