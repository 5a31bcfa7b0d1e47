"""Run records (diffllm/results.py): a run's Kaplan N comes from the model config it saved (config.yaml), not from
the current preset of the same name; a run without a saved config has none."""

from __future__ import annotations

import dataclasses
import json

import yaml

from diffllm.model.accounting import meta_model, model_stats
from diffllm.model.config import ModelConfig
from diffllm.model.presets import load_preset
from diffllm.results import collect, read_run


def block_count(cfg: ModelConfig) -> int:
    """Parameters of the decoder blocks and the final norm: everything but the embedding table and the output head."""
    return sum(
        p.numel() for n, p in meta_model(cfg).named_parameters() if not n.startswith(("tok_embeddings.", "lm_head."))
    )


def write_run(run_dir, model: str, **changes) -> ModelConfig:
    """A finished run of preset `model` whose saved model config has `changes` (as if the preset changed since)."""
    cfg = dataclasses.replace(load_preset(model), **changes)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"model": dataclasses.asdict(cfg), "seed": 1}))
    s = model_stats(cfg)  # the summary's counts are the trained model's, as the trainer writes them
    (run_dir / "summary.json").write_text(
        json.dumps(
            {
                "model": model,
                "arch": cfg.arch,
                "total_params": s.total_params,
                "nonembedding_params": s.nonembedding_params,
                "status": "finished",
                "tokens": 1024,
                "final_val_loss": 5.0,
            }
        )
    )
    return cfg


def test_kaplan_n_is_the_runs_own(tmp_path):
    preset = load_preset("transformer-micro-1")
    assert not preset.tie_embeddings and preset.d_model != 48
    wider = write_run(tmp_path / "wider", "transformer-micro-1", d_model=48, n_layers=3)
    tied = write_run(tmp_path / "tied", "transformer-micro-1", tie_embeddings=True, vocab_size=1000)
    records = {r.run_dir: r for r in collect(tmp_path)}
    assert records[str(tmp_path / "wider")].block_params == block_count(wider) != block_count(preset)
    # tied: the head is the table, so nothing more is taken off (the preset, untied, would take a head's worth)
    assert records[str(tmp_path / "tied")].block_params == block_count(tied) == block_count(preset)


def test_a_run_without_a_saved_config_has_no_kaplan_n(tmp_path):
    write_run(tmp_path / "old", "transformer-micro-1")
    (tmp_path / "old" / "config.yaml").unlink()
    assert read_run(tmp_path / "old").block_params is None
