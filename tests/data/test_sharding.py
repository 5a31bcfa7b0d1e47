"""Sharding: the streams of all ranks and workers together read every document exactly once per epoch, also when
the file count is not a multiple of the world size."""

from __future__ import annotations

from collections import Counter

import pytest

from diffllm.data import build_train_loader
from diffllm.data.packing import assign_items

from .helpers import cfg, corpus, drain, split_docs


@pytest.mark.parametrize("n_files", range(1, 13))
@pytest.mark.parametrize("n_streams", range(1, 9))
def test_assignment_reads_each_example_once(n_files, n_streams):
    per_file = 7
    seen = Counter()
    for s in range(n_streams):
        items = assign_items(n_files, n_streams, s)
        assert items, f"stream {s} got nothing"
        for f, stride, phase in items:
            seen.update((f, j) for j in range(phase, per_file, stride))
    assert seen == Counter((f, j) for f in range(n_files) for j in range(per_file))
    readers = Counter(f for s in range(n_streams) for f, _, _ in assign_items(n_files, n_streams, s))
    left = n_files % n_streams  # whole files are read once; each leftover file by about n_streams / left streams
    assert max(readers.values()) == (-(-n_streams // left) if left else 1)


@pytest.mark.parametrize("world_size,workers", [(1, 0), (2, 0), (3, 0), (2, 2)])
def test_union_of_ranks_is_one_pass(tmp_path, tok, world_size, workers):
    docs = corpus(tmp_path, n_files=5, docs_per_file=9)  # 5 files: not divisible by 2, 3 or 4
    data = cfg([{"path": str(tmp_path / "*.jsonl")}], num_workers=workers)
    streams = []
    for rank in range(world_size):
        loader = build_train_loader(data, tok, rank, world_size, 1)
        streams += [s for g in loader.slots() for s in loader.streams_of(g)]
    n = world_size * max(1, workers)
    assert sorted(streams) == list(range(n))
    read = Counter(d for s in streams for d in split_docs(drain(data, tok, s, n), tok))
    assert read == Counter(docs)


def test_hub_dataset_shards_cover_once(tmp_path, tok):
    """format: hub goes through load_dataset(<name>) and its shards; a local dataset folder stands in for the hub."""
    docs = corpus(tmp_path / "repo" / "data", n_files=3, docs_per_file=7)
    data = cfg([{"name": "hub", "path": str(tmp_path / "repo"), "format": "hub"}])
    loader = build_train_loader(data, tok, 0, 2, 1)
    assert loader.sources[0].n_files == 3 and next(loader).tokens.shape == (1, 32)
    read = Counter(d for s in range(2) for d in split_docs(drain(data, tok, s, 2), tok))
    assert read == Counter(docs)
