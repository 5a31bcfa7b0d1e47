"""Synthetic in-context classification: the training side of `diffllm eval icl task=synthetic`.

A document is D demonstrations of one word -> label mapping, rendered exactly as eval icl renders a demonstration
with its default template (TEMPLATE):

    Input: w_1\\nLabel:[ l_1]\\nInput: w_2\\nLabel:[ l_2]\\n ... Input: w_D\\nLabel:[ l_D]\\n

The mapping is drawn per document as eval's synthetic task draws it per prompt (`mapping`): `words` distinct words of
WORDS, each given a label of SYNTHETIC_LABELS, balanced and shuffled (both used); each demonstration's word is drawn
uniformly from the document's words, so no weight can hold a word's label: only the demonstrations before it say it.
Only the bracketed labels are marked (a `Marked` document: with data.loss_on=marked they alone count in the loss;
the first time a word appears its label is a guess, later ones are in-context recall). The segments are cut before
each label and after it: "Input: w_1\\nLabel:" | " l_1" (counts) | "\\nInput: w_2\\nLabel:" | ... | "\\n", where a
byte-level BPE splits anyway, so the packer's tokens are those of eval icl, which encodes each demonstration whole
(and a query "Input: w\\nLabel:" then the label " l"; tested). The packer puts EOS after each document, as eval icl
puts EOS before its demonstrations.

Split: the mapping is per document, so there is nothing to hold out but documents: split=train and split=test draw
from seed streams of their own ([seed, split, file, j]), as recall.py's do; eval icl's prompts come from yet another
stream ([seed, i], eval/icl_tasks.py).

As a `data` source:
    - name: icl
      format: icl
      path: "icl:words=4,demos=8-48,docs=100000,seed=0,split=train"   # every key optional ("icl": defaults)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import UserError
from .batch import Marked
from .needle import set_fields
from .recall import SPLITS, seeded, spec_fingerprint

# common one-token-ish English words; the synthetic task's inputs, and its labels (eval/icl_tasks.py reads both)
WORDS = (
    "apple river stone cloud horse table bread glass music paper chair light water green house money night "
    "field bird window garden letter ship king queen door fire snow tree road sword book wine"
).split()
SYNTHETIC_LABELS = ("yes", "no")
TEMPLATE = "Input: {text}\nLabel: {label}\n"  # eval icl's default template (IclConfig.template, unescaped)


def mapping(rng: np.random.Generator, n_words: int) -> tuple[list[str], np.ndarray]:
    """n_words distinct words of WORDS and a label index of SYNTHETIC_LABELS for each: balanced, shuffled."""
    words = [WORDS[j] for j in rng.choice(len(WORDS), n_words, replace=False)]
    return words, rng.permutation(np.arange(n_words) % len(SYNTHETIC_LABELS))


def segments(text: str, label: str) -> list[tuple[str, bool]]:
    """One demonstration as TEMPLATE fills it, cut as eval icl tokenizes a query and its label: the template up to
    {label} with trailing spaces stripped | those spaces + the label (counts) | the rest."""
    head, tail = TEMPLATE.split("{label}")
    query = head.rstrip(" ")
    return [(query.replace("{text}", text), False), (head[len(query) :] + label, True), (tail, False)]


@dataclass
class IclSpec:
    words: int = 4  # distinct words per document's mapping (eval icl's synthetic task: 4)
    demos: tuple = (8, 48)  # demonstrations per document, drawn uniformly in [lo, hi]
    docs: int = 100_000  # per file (a source has one file); a finite file lets validation streams end
    seed: int = 0
    split: str = "train"  # train | test: seed streams of their own

    @classmethod
    def parse(cls, path: str) -> IclSpec:
        """'icl' or 'icl:words=4,demos=8-48,docs=100000,seed=0,split=train'."""
        spec = set_fields(cls(), path, "icl", ("demos",))
        if not len(SYNTHETIC_LABELS) <= spec.words <= len(WORDS):
            raise UserError(f"path {path!r}: words={spec.words}: must be in {len(SYNTHETIC_LABELS)}..{len(WORDS)}")
        if not 1 <= spec.demos[0] <= spec.demos[1] or spec.docs < 1:
            raise UserError(f"path {path!r}: needs 1 <= demos LO <= HI and docs >= 1")
        if spec.split not in SPLITS:
            raise UserError(f"path {path!r}: split={spec.split!r}: expected one of {SPLITS}")
        return spec

    def fingerprint(self) -> str:
        return spec_fingerprint(self)


def icl_document(rng: np.random.Generator, n_words: int, n_demos: int) -> Marked:
    """One document of the layout above: a fresh mapping, n_demos demonstrations of it."""
    words, labels = mapping(rng, n_words)
    parts: list[tuple[str, bool]] = []
    for j in rng.integers(0, n_words, n_demos):
        for text, counts in segments(words[j], SYNTHETIC_LABELS[labels[j]]):
            if parts and not counts and not parts[-1][1]:  # "\n" + "Input: w\nLabel:": one segment (fewer to encode)
                parts[-1] = (parts[-1][0] + text, False)
            else:
                parts.append((text, counts))
    return Marked(parts)


def documents(spec: IclSpec, file: int, start: int, stride: int) -> Iterator[tuple[int, str, int]]:
    """(index, document, 0) for documents start, start+stride, ... of file `file` (recall.py's `seeded`)."""
    for j, rng in seeded(spec, file, start, stride):
        n_demos = int(rng.integers(spec.demos[0], spec.demos[1] + 1))
        yield j, icl_document(rng, spec.words, n_demos), 0
