"""An export prints no stray progress bar: transformers' save_pretrained drew a tqdm "Writing model shards" bar in the
middle of `diffllm export`'s own lines (issue 56); the bar settings are as they were afterwards."""

from __future__ import annotations

import torch

from diffllm.export import diffllama
from diffllm.export.hf import write_hf
from diffllm.model import DecoderLM, ModelConfig


def test_write_hf_draws_no_progress_bar_and_restores_the_settings(tmp_path, capsys):
    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    cfg = ModelConfig(arch="diff", d_model=32, n_layers=1, n_heads=4, vocab_size=64, max_seq_len=16)
    torch.manual_seed(0)
    state = DecoderLM(cfg).state_dict()
    before = (hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled())
    assert before[0]  # on by default: the bar would be drawn
    write_hf(cfg, state, tmp_path / "hf", diffllama)
    out, err = capsys.readouterr()
    assert "Writing model shards" not in out + err and "it/s" not in err
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert (hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()) == before
