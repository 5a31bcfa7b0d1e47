"""An export prints no stray progress bar: transformers' save_pretrained drew a tqdm "Writing model shards" bar in the
middle of `diffllm export`'s own lines (issue 56); the bar settings are as they were afterwards."""

from __future__ import annotations

import pytest
import torch

from diffllm.export import diffllama
from diffllm.export.hf import write_hf
from diffllm.model import DecoderLM, ModelConfig


@pytest.mark.parametrize("bars_on", [True, False])
def test_write_hf_draws_no_progress_bar_and_restores_the_settings(tmp_path, capsys, bars_on):
    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    cfg = ModelConfig(arch="diff", d_model=32, n_layers=1, n_heads=4, vocab_size=64, max_seq_len=16)
    torch.manual_seed(0)
    state = DecoderLM(cfg).state_dict()
    was = hf_logging.is_progress_bar_enabled()  # as this session left them (another test may have turned them off)
    (hf_logging.enable_progress_bar if bars_on else hf_logging.disable_progress_bar)()
    try:
        before = (hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled())
        write_hf(cfg, state, tmp_path / "hf", diffllama)
        out, err = capsys.readouterr()
        assert "Writing model shards" not in out + err and "it/s" not in err
        assert (tmp_path / "hf" / "model.safetensors").is_file()
        assert (hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()) == before
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()
