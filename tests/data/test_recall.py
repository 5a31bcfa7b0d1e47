"""The `recall` source (diffllm/data/recall.py): documents hold the layout they claim, exactly the queried values are
marked (checked on packed windows against a rule on the words), and the held-out split shares no binding set, and
so no document, with training."""

from __future__ import annotations

import numpy as np

from diffllm.data.batch import MARKS, TOKENS
from diffllm.data.needle import FILLER, KEYS, VALUES
from diffllm.data.recall import RecallSpec, documents, heldout, recall_document

from .helpers import cfg
from .test_structure import windows

RECALL = {"name": "recall", "format": "recall", "path": "recall:pairs=2-6,length=40,gap=0-8,docs=400"}


def bindings(doc: str) -> frozenset:
    """The {key: value} set a document's context states: each key's first occurrence is followed by its value."""
    words, first = doc.split(), {}
    for i, w in enumerate(words):
        if w in KEYS and w not in first:
            first[w] = words[i + 1]
    return frozenset(first.items())


def test_documents_hold_the_layout_and_mark_the_values():
    spec = RecallSpec.parse(RECALL["path"])
    for _j, doc, _ in documents(spec, 0, 0, 1):
        words = str(doc).split()
        n = len({w for w in words if w in KEYS})
        assert len(words) == spec.length and spec.pairs[0] <= n <= spec.pairs[1]
        pairs = dict(bindings(doc))
        assert len(pairs) == n and len(set(pairs.values())) == n  # keys and values unique in a document
        queries = words[-2 * n :]
        assert sorted(queries[0::2]) == sorted(pairs)  # every key queried once
        assert queries[1::2] == [pairs[k] for k in queries[0::2]]  # ... followed by its value
        marked = [text.strip() for text, counts in doc.parts if counts]
        assert marked == queries[1::2]  # exactly the queried values count
        first_key = min(words.index(k) for k in pairs)  # filler, the pairs block, `gap` filler words, the queries
        gap = len(words) - 2 * n - (first_key + 2 * n)
        assert spec.gap[0] <= gap <= spec.gap[1]
        assert all(w in FILLER for w in words[:first_key] + words[first_key + 2 * n : len(words) - 2 * n])
        assert all(w in VALUES for w in words[first_key + 1 : first_key + 2 * n : 2])


def test_packed_windows_mark_exactly_the_query_values(tok):
    """loss_on=marked: per packed document, the marked tokens are the values of the last 2N words, nothing else."""
    data = cfg([RECALL], seq_len=63, loss_on="marked")
    stream = np.concatenate(windows(data, tok, 60), axis=1)
    ends = np.flatnonzero(stream[TOKENS] == tok.eos_id)
    checked = 0
    for a, b in zip(ends[:-1], ends[1:]):  # whole documents between two EOS
        ids, marks = stream[TOKENS, a + 1 : b], stream[MARKS, a + 1 : b]
        words = tok.decode(ids.tolist()).split()
        n = len({w for w in words if w in KEYS})
        runs, cur = [], []
        for t, m in zip(ids.tolist(), marks.tolist()):
            if m:
                cur.append(t)
            elif cur:
                runs, cur = runs + [cur], []
        runs += [cur] if cur else []
        assert [tok.decode(r).strip() for r in runs] == words[-2 * n + 1 :: 2]
        assert stream[MARKS, b] == 0  # the EOS is not an answer
        checked += 1
    assert checked >= 20


def test_the_held_out_split_shares_no_binding_set_with_training():
    """With N = 1 there are 32 x 32 binding sets; 3,000 training documents cover nearly all training ones, and not
    one held-out set (nor document) is among them; the held-out documents are varied draws of their own."""
    train = RecallSpec.parse("recall:pairs=1,length=8,gap=0-4,docs=3000")
    test = RecallSpec.parse("recall:pairs=1,length=8,gap=0-4,docs=400,split=test")
    train_docs = [str(d) for _, d, _ in documents(train, 0, 0, 1)]
    test_docs = [str(d) for _, d, _ in documents(test, 0, 0, 1)]
    train_sets, test_sets = {bindings(d) for d in train_docs}, {bindings(d) for d in test_docs}
    assert len(train_sets) > 0.9 * len(KEYS) * len(VALUES) * 7 / 8 - 100  # the training sets are well covered
    assert len(test_sets) > 80  # (1/8 of 1,024 sets exist) varied held-out draws
    assert not train_sets & test_sets and not set(train_docs) & set(test_docs)
    assert all(heldout(*zip(*s)) for s in test_sets) and not any(heldout(*zip(*s)) for s in train_sets)
    rng = np.random.default_rng(0)  # larger N: the rule holds for every draw, whatever N
    for n in (2, 4, 8):
        for split in ("train", "test"):
            pairs = bindings(recall_document(rng, n, 0, 4 * n, split))
            assert heldout(*zip(*pairs)) == (split == "test")
