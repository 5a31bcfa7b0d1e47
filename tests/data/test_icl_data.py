"""The `icl` source (diffllm/data/icl.py): document j is a function of its index alone, the train and test streams
differ, each document's mapping is balanced and consistent, exactly the labels are marked, and the packer's tokens are
the tokens `diffllm eval icl task=synthetic` builds for the same demonstrations (under data=shakespeare's BPE)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from diffllm.config import build, compose
from diffllm.data import DataConfig, DataError, build_train_loader
from diffllm.data.batch import MARKS, TOKENS
from diffllm.data.icl import SYNTHETIC_LABELS, WORDS, IclSpec, documents, mapping
from diffllm.data.loader import resolve_sources
from diffllm.data.tokenizer import train_sources
from diffllm.eval import icl
from diffllm.eval.icl_tasks import Episode, Task
from tests.distributed import cli_here

from .helpers import cfg
from .test_structure import windows

ICL = {"name": "icl", "format": "icl", "path": "icl:words=4,demos=4-12,docs=500"}
DEMO = re.compile(r"Input: (\w+)\nLabel: (yes|no)\n")


def demos(text: str) -> list[tuple[str, str]]:
    """(word, label) of each demonstration; the text must be nothing but demonstrations."""
    found = DEMO.findall(text)
    assert "".join(f"Input: {w}\nLabel: {y}\n" for w, y in found) == text
    return found


def every(path: str, start: int = 0, stride: int = 1, file: int = 0) -> list:
    return [(j, d.parts) for j, d, _ in documents(IclSpec.parse(path), file, start, stride)]


def test_document_j_is_the_same_whoever_reads_it():
    """Three readers striding by 3 read exactly the single reader's documents; another file reads others."""
    path = "icl:demos=2-9,docs=60,seed=5"
    one = every(path)
    shared = sorted(x for s in range(3) for x in every(path, s, 3))
    assert [j for j, _ in one] == list(range(60)) and shared == one
    assert every(path) == one  # again: the same
    assert not {p for _, p in one} & {p for _, p in every(path, file=1)}


def test_the_train_and_test_streams_share_no_document():
    train = {str(d) for _, d, _ in documents(IclSpec.parse("icl:demos=8-16,docs=400"), 0, 0, 1)}
    test = {str(d) for _, d, _ in documents(IclSpec.parse("icl:demos=8-16,docs=400,split=test"), 0, 0, 1)}
    assert len(train) == len(test) == 400 and not train & test


def test_each_document_holds_one_balanced_mapping():
    """A document's demonstrations give each word one label; with all of its words shown, half are yes, half no;
    across documents the mapping changes, and mapping() is what eval icl's synthetic task draws per prompt."""
    spec = IclSpec.parse("icl:words=4,demos=30-40,docs=300")
    seen = set()
    for _, doc, _ in documents(spec, 0, 0, 1):
        pairs = demos(str(doc))
        assert spec.demos[0] <= len(pairs) <= spec.demos[1]
        labels = dict(pairs)
        assert len(labels) == len(set(pairs)) and set(labels) <= set(WORDS)  # each word one label
        if len(labels) == spec.words:  # all 4 words shown (nearly every document at 30+ demonstrations)
            assert sorted(labels.values()) == ["no", "no", "yes", "yes"]
            seen.add(frozenset(labels.items()))
    assert len(seen) > 250  # fresh mappings
    for n in (2, 4, 5, 9):
        words, y = mapping(np.random.default_rng(n), n)
        assert len(set(words)) == n and sorted(np.bincount(y, minlength=2)) == [n // 2, n - n // 2]


def test_exactly_the_labels_are_marked(tokenizer):
    """Packed windows (loss_on=marked): per whole document, the marked tokens are its labels' tokens and nothing
    else, and the share of marked tokens equals the count of the demonstrations' label tokens over all tokens."""
    stream = np.concatenate(windows(cfg([ICL], seq_len=127, loss_on="marked"), tokenizer, 40), axis=1)
    ends = np.flatnonzero(stream[TOKENS] == tokenizer.eos_id)
    label_tokens = {y: tokenizer.encode(" " + y) for y in SYNTHETIC_LABELS}
    marked = total = want = 0
    for a, b in zip(ends[:-1], ends[1:]):  # whole documents between two EOS
        ids, marks = stream[TOKENS, a + 1 : b + 1].tolist(), stream[MARKS, a + 1 : b + 1].tolist()
        pairs = demos(tokenizer.decode(ids[:-1]))
        assert [t for t, m in zip(ids, marks) if m] == [t for _, y in pairs for t in label_tokens[y]]
        assert marks[-1] == 0  # the EOS is not an answer
        marked, total, want = marked + sum(marks), total + len(ids), want + sum(len(label_tokens[y]) for _, y in pairs)
    assert len(ends) > 20 and marked / total == pytest.approx(want / total, abs=1e-12) and 0.05 < marked / total < 0.2


def test_the_packed_tokens_are_eval_icls_prompt_tokens(tokenizer):
    """For each whole packed document: EOS + its demonstrations but the last + the last's query is exactly the prompt
    eval icl builds (IclConfig's default template) for those demonstrations and that query, and the tokens after it
    are eval's tokens of the query's label."""
    stream = np.concatenate(windows(cfg([ICL], seq_len=127), tokenizer, 40), axis=1)[TOKENS].tolist()
    ends = [i for i, t in enumerate(stream) if t == tokenizer.eos_id]
    for a, b in zip(ends[:-1], ends[1:]):
        pairs = [(w, SYNTHETIC_LABELS.index(y)) for w, y in demos(tokenizer.decode(stream[a + 1 : b]))]
        task = Task("synthetic", list(SYNTHETIC_LABELS), [Episode(pairs[-1], pairs[:-1])])
        p = icl.tokenize(task, tokenizer, icl.IclConfig.template, len(pairs) - 1)
        prompt = p.ids(0, list(range(len(pairs) - 1)))
        label = p.labels[pairs[-1][1]]
        assert stream[a : a + len(prompt) + len(label) + 1] == prompt + label + tokenizer.encode("\n")
        assert a + len(prompt) + len(label) + 1 == b  # ... and that is the whole document
    assert len(ends) > 20


def test_shakespeare_icl_mixes_counted_plays_with_marked_labels(tokenizer):
    """data=shakespeare-icl as a command composes it, through the real loader: the plays' windows count every
    target, the icl windows only their labels; the BPE trains on the plays alone (data=shakespeare's tokenizer)."""
    data = build(
        DataConfig,
        compose("train", ["data=shakespeare-icl", "data.num_workers=0", "data.tokenize_chars=65536"]).data,
        "data",
    )
    plain = build(DataConfig, compose("train", []).data, "data")
    assert [s.fingerprint for s in train_sources(data)] == [s.fingerprint for s in train_sources(plain)]
    assert data.loss_on == "marked" and [s.name for s in resolve_sources(data, val=True)] == ["plays-heldout"]
    loader = build_train_loader(data, tokenizer, 0, 1, 8)
    plays = labels = 0
    for _ in range(4):
        batch = next(loader)
        for row, mask in zip(batch.tokens.tolist(), batch.loss_mask.tolist()):
            if all(mask):
                plays += 1
                assert "Label:" not in tokenizer.decode(row)
            else:
                runs = "".join(tokenizer.decode([t]) if m else "|" for t, m in zip(row, mask)).split("|")
                assert set(runs) - {""} <= {" yes", " no"} and "\nLabel:" in tokenizer.decode(row)
                labels += 1
    assert plays >= 16 and labels >= 2, (plays, labels)


@pytest.mark.parametrize(
    "fmt, path, message",
    [
        ("icl", "icl:words=1", "data.sources[0].path 'icl:words=1': words=1: must be in 2..33"),
        ("icl", "icl:word=4", "unknown key 'word' (keys: words, demos, docs, seed, split)"),
        ("icl", "icl:split=val", "split='val': expected one of ('train', 'test')"),
        ("icl", "icl:demos=x", "demos='x' is not a number"),
        ("icl", "icl:demos=9-3", "needs 1 <= demos LO <= HI and docs >= 1"),
        ("icl", "recall:words=4", "a icl source's path is 'icl' or 'icl:key=value,...'"),
        ("recall", "recall:pairs=9,length=32", "'recall:pairs=9,length=32': length=32: cannot hold 9 pairs"),
        ("recall", "recall:pair=2", "unknown key 'pair' (keys: pairs, length, gap, docs, seed, split)"),
        ("recall", "recall:split=val", "split='val': expected one of ('train', 'test')"),
        ("recall", "recall:gap=x", "gap='x' is not a number"),
    ],
)
def test_bad_task_specs_are_one_line_errors(fmt, path, message):
    """The synthetic sources (icl here, recall: tests/data/test_recall.py) refuse a bad path in one line."""
    with pytest.raises(DataError) as e:
        resolve_sources(cfg([{"name": "t", "format": fmt, "path": path}]))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_bad_spec_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    got = cli_here(
        "tokenizer",
        "train",
        "data=shakespeare-icl",
        "data.sources.1.path='icl:demos=0'",
        env={"DIFFLLM_CACHE": str(tmp_path)},
    )
    assert got.returncode == 2 and len(got.stderr.splitlines()) == 1, got.stderr
    assert "data.sources[1].path 'icl:demos=0': needs 1 <= demos LO <= HI" in got.stderr
