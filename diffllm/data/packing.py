"""Packer: one source's documents on one stream -> EOS-separated, unpadded windows; its state is where the next
window starts (epoch, file item, example index, token offset), so a restore re-reads one document and is exact."""

from __future__ import annotations

import hashlib
import os
from collections import deque
from typing import Iterator, Optional

import numpy as np

from .batch import DOCS, MARKS, TOKENS, Marked
from .config import DataError
from .sources import Reader, Source
from .tokenizer import Tokenizer, say

COUNTS = ("docs", "empty", "undecodable", "bad_records", "tokens")  # per source and stream, in its state

Item = tuple[int, int, int]  # (file index, stride, phase): examples phase, phase+stride, ... of that file


def assign_items(n_files: int, n_streams: int, stream: int) -> list[Item]:
    """Which parts of a source a stream reads, so that the streams together read every example exactly once.
    Whole files go round-robin; the last n_files % n_streams files are each split by example index among the
    streams that got no extra whole file (stream s reads leftover file s % left). Each file is read by as few
    streams as possible, and no stream is left empty."""
    whole = n_files // n_streams * n_streams
    items = [(f, 1, 0) for f in range(stream, whole, n_streams)]
    left = n_files - whole
    if left:
        sharers = list(range(stream % left, n_streams, left))
        items.append((whole + stream % left, len(sharers), sharers.index(stream)))
    return items


def held_out(source: str, label: str, example: int, fraction: float) -> bool:
    """Whether document `example` of file `label` of a source is in the validation split of data.val_fraction: a hash
    of (source name, file name, example index), so the split is the same for every run, seed, world size and layout,
    and training (which skips these documents) and validation never share one."""
    h = hashlib.sha256(f"{source}\0{os.path.basename(label)}\0{example}".encode()).digest()
    return int.from_bytes(h[:8], "big") < fraction * 2.0**64


def fresh_state(order: list[Item]) -> dict:
    return {
        "epoch": 0,
        "item": 0,
        "example": order[0][2],
        "offset": 0,
        "docs": 0,
        "empty": 0,
        "undecodable": 0,
        "bad_records": 0,
        "tokens": 0,
    }


class Packer:
    """Windows of `window` tokens from one source on one stream. Documents are tokenized in batches, each followed
    by EOS, and cut into consecutive windows with no padding; a document longer than a window spans several."""

    def __init__(
        self,
        src: Source,
        reader: Reader,
        tok: Tokenizer,
        window: int,
        items: list[Item],
        order_seed: Optional[list[int]],
        epochs: Optional[int],
        tokenize_chars: int,
        state: Optional[dict],
        split: Optional[tuple[float, bool]] = None,
    ):
        self.src, self.reader, self.tok, self.window, self.items = src, reader, tok, window, items
        self.split = split  # (val_fraction, True: only held-out documents | False: all but them); None: every document
        self.order_seed, self.epochs, self.tokenize_chars = order_seed, epochs, tokenize_chars
        st = dict(state or fresh_state(self.order(0)))
        self.counts = {k: st.get(k, 0) for k in COUNTS}  # bad_records: absent from states saved before it
        self._next = (st["epoch"], st["item"], st["example"])  # where reading resumes once the queue is empty
        self._skip = st["offset"]  # tokens of the first document already consumed
        # [(epoch, item, example), stride, tokens (with EOS), undecodable, loss marks, bad records skipped before it]
        self._queue: deque = deque()
        self._off = 0  # tokens of the queue's first document already consumed
        self._buffered = 0  # tokens in the queue not yet consumed
        self._docs: Optional[Iterator] = None
        self._reported: set = set()

    def order(self, epoch: int) -> list[Item]:
        """This stream's items in the order of `epoch` (seeded shuffle per epoch, or fixed)."""
        if self.order_seed is None:
            return self.items
        perm = np.random.default_rng(self.order_seed + [epoch]).permutation(len(self.items))
        return [self.items[k] for k in perm]

    def state(self) -> dict:
        """Start of the next window: the document at (epoch, item, example) with `offset` tokens already used."""
        if self._queue:
            (e, i, j), off = self._queue[0][0], self._off
        else:
            (e, i, j), off = self._next, 0
        return {"epoch": e, "item": i, "example": j, "offset": off, **self.counts}

    def _read(self) -> Iterator[Optional[tuple[tuple[int, int, int], int, object, int]]]:
        e, i, j = self._next
        while self.epochs is None or e < self.epochs:
            order = self.order(e)
            whole_epoch, found, empty = (i == 0 and j == order[0][2]), 0, 0
            while i < len(order):
                f, stride, _ = order[i]
                for jj, doc, bad in self.reader.docs(f, j, stride):
                    if self.split and held_out(self.src.name, self.src.files[f], jj, self.split[0]) != self.split[1]:
                        continue
                    found += bool(doc is not None and len(doc))
                    empty += not (doc is not None and len(doc))
                    yield (e, i, jj), stride, doc, bad, self.reader.skipped.pop((f, jj), 0)
                i += 1
                j = order[i][2] if i < len(order) else 0
            if whole_epoch and not found:
                raise DataError(
                    f"source {self.src.name!r}: a stream read a whole epoch without a document ({empty} empty) "
                    f"from its {len(order)} file part(s); use fewer streams (world_size x data.num_workers) or more, "
                    "fuller files"
                )
            e, i = e + 1, 0
            j = self.order(e)[0][2]
            yield None  # epoch boundary: a small corpus is not read ahead for many epochs

    def _fill(self) -> bool:
        """Read and tokenize about tokenize_chars characters of documents into the queue; False at the end."""
        if self._docs is None:
            self._docs = self._read()
        batch, chars = [], 0
        for entry in self._docs:
            if entry is None:
                if batch:
                    break
                continue
            doc = entry[2]
            batch.append(entry)
            chars += len(doc) if isinstance(doc, str) else 4 * (0 if doc is None else len(doc))
            if chars >= self.tokenize_chars:
                break
        if not batch:
            return False
        for (pos, stride, _, bad, skipped), (toks, marks) in zip(batch, self._tokenize([e[2] for e in batch])):
            self._queue.append((pos, stride, toks, bad, marks, skipped))
            self._buffered += len(toks)
            if self._skip:  # restoring: the first document was partly used before the state was saved
                self._off, self._skip = self._skip, 0
                self._buffered -= self._off
        return True

    def _tokenize(self, docs: list) -> list[tuple[np.ndarray, np.ndarray]]:
        """(tokens + EOS, loss marks) per document, tokenized in one batch: a Marked document segment by segment, its
        EOS unmarked (a task marks its answers; predicting the document's end is none of them, e.g. after a recall
        document's last answer); every other document's tokens and EOS marked 1. An empty document: no tokens, not even
        EOS."""
        texts = [
            t for d in docs if isinstance(d, str) and d for t in (d.parts if isinstance(d, Marked) else [(d, True)])
        ]
        ids = iter(self.tok.encode_batch([t for t, _ in texts])) if texts else iter(())
        out = []
        for doc in docs:
            if doc is None or not len(doc):
                out.append((np.zeros(0, np.int32), np.zeros(0, np.int32)))
                continue
            if isinstance(doc, str):
                segs = [(next(ids), counts) for _, counts in (doc.parts if isinstance(doc, Marked) else [(doc, True)])]
            else:  # pre-tokenized (prepared shards)
                segs = [(doc, True)]
            body = np.concatenate([np.asarray(t, np.int32) for t, _ in segs])
            marks = np.concatenate([np.full(len(t), counts, np.int32) for t, counts in segs])
            toks = np.append(body, np.int32(self.tok.eos_id)).astype(np.int32)
            out.append((toks, np.append(marks, int(not isinstance(doc, Marked))).astype(np.int32)))
        return out

    def next_window(self) -> np.ndarray:
        """(3, window) int32: tokens, document ordinals, loss marks (the rows of diffllm.data.batch); StopIteration
        once a finite number of epochs is exhausted (nothing consumed)."""
        while self._buffered < self.window:
            if not self._fill():
                raise StopIteration
        out = np.empty((3, self.window), np.int32)
        at = doc = 0
        while at < self.window:
            toks, marks = self._queue[0][2], self._queue[0][4]
            take = min(len(toks) - self._off, self.window - at)
            if take:
                out[TOKENS, at : at + take] = toks[self._off : self._off + take]
                out[MARKS, at : at + take] = marks[self._off : self._off + take]
                out[DOCS, at : at + take] = doc
                at, self._off = at + take, self._off + take
            if self._off == len(toks):
                doc += take > 0  # the next part of the window is another document
                self._pop()
        while self._queue and not len(self._queue[0][2]):  # empty documents right after the window: count them now
            self._pop()
        self._buffered -= self.window
        return out

    def _pop(self) -> None:
        (e, i, j), stride, toks, bad, _, skipped = self._queue.popleft()
        self.counts["docs" if len(toks) else "empty"] += 1
        self.counts["undecodable"] += bad
        self.counts["bad_records"] += skipped
        self._report(not len(toks), "empty documents are skipped (no tokens, no EOS) and counted", (e, i, j))
        self._report(bad, "undecodable bytes are replaced by U+FFFD and counted", (e, i, j))
        self.counts["tokens"] += len(toks)
        self._off = 0
        self._next = (e, i, j + stride)

    def _report(self, happened: object, what: str, pos: tuple[int, int, int]) -> None:
        """Say it once per source and stream, at the first occurrence (the counts go on in the state)."""
        if happened and what not in self._reported:
            self._reported.add(what)
            e, i, j = pos
            say(f"source {self.src.name!r}: {what} (first: {self.src.files[self.order(e)[i][0]]} example {j})")

    def tail(self) -> np.ndarray:
        """Tokens read but not yet packed into a window (what a finite run leaves over at its end)."""
        rest = [q[2][self._off if k == 0 else 0 :] for k, q in enumerate(self._queue)]
        return np.concatenate(rest) if rest else np.zeros(0, np.int32)
