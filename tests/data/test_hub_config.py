"""The paper-scale data config (data=fineweb-edu, used by sweep=paper), resolved as far as possible offline: it
composes, builds typed, hands datasets.load_dataset a streamed hub spec, and fails in one line without the hub."""

from __future__ import annotations

import pytest

from diffllm.config import build, compose
from diffllm.data import DataConfig, DataError
from diffllm.data.loader import resolve_sources
from diffllm.data.sources import hub_args


def _paper_data() -> DataConfig:
    sweep = compose("sweep", ["sweep=paper"]).sweep
    train = compose("train", ["model=transformer-830m", *sweep.overrides])
    return build(DataConfig, train.data, "data")


def test_paper_sweep_trains_on_fineweb_edu_with_a_100k_bpe():
    data = _paper_data()
    assert data.name == "fineweb-edu" and data.seq_len == 2048
    (src,) = data.sources
    assert (src.format, src.name, src.text_field) == ("hub", "fineweb-edu", "text")
    assert hub_args(src) == (
        ("HuggingFaceFW/fineweb-edu", "sample-100BT"),
        {"split": "train", "revision": None, "streaming": True},
    )
    assert data.tokenizer.path is None and data.tokenizer.vocab_size == 100352
    assert data.holds_out and data.val_fraction == 0.01 and not data.val  # the hub dataset has only a train split


def test_without_the_hub_it_fails_in_one_line_naming_the_dataset(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the test session is offline: nothing may download
    with pytest.raises(DataError) as e:
        resolve_sources(_paper_data())
    msg = str(e.value)
    assert msg.startswith("data.sources[0]: cannot open hub dataset 'HuggingFaceFW/fineweb-edu': ") and "\n" not in msg
