"""Typed data configs (the `data` Hydra group): sources, validation, tokenizer, streaming layout; and DataError."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from ..errors import UserError

FORMATS = ("auto", "jsonl", "json", "parquet", "text", "hub", "needle", "recall", "icl")  # the last 3: synthetic
SAMPLE_BY = ("document", "paragraph", "line")
LOSS_ON = ("all", "marked")
ON_BAD_RECORD = ("error", "skip")
MAX_VOCAB = (1 << 31) - 1  # token ids are int32 in the loader's windows


class DataError(UserError):
    """Bad data input or state: the message is one line naming the file or key and the problem."""


def cache_dir() -> Path:
    """Where derived artefacts (trained tokenizers) are cached: $DIFFLLM_CACHE or ~/.cache/diffllm."""
    return Path(os.environ.get("DIFFLLM_CACHE") or Path.home() / ".cache" / "diffllm")


@dataclass
class SourceConfig:
    """One corpus: local files (globs; `pkg:<module>/<path>` is relative to an installed package) or a hub dataset."""

    path: Any = ""  # file, glob, list of them; or a hub dataset name when format=hub
    name: str = ""  # unique within the data config; default: the file stem / hub name
    format: str = "auto"  # auto (from the file suffix) | jsonl | json | parquet | text | hub
    text_field: str = "text"  # column holding the document text (jsonl/json/parquet/hub)
    weight: float = 1.0  # mixture weight: the share of training windows drawn from this source
    # fnmatch patterns on file names to leave out (e.g. held-out files)
    exclude: List[str] = field(default_factory=list)
    sample_by: str = "document"  # text only: a document is a whole file | a paragraph | a line
    hub_config: Optional[str] = None  # hub only: dataset config name
    split: str = "train"  # hub only
    revision: Optional[str] = None  # hub only

    def validate(self, where: str) -> None:
        if not self.path:
            raise DataError(f"{where}.path: missing (a file, glob, list of them, or a hub dataset name)")
        if self.format not in FORMATS:
            raise DataError(f"{where}.format: got {self.format!r}, expected one of {FORMATS}")
        if self.sample_by not in SAMPLE_BY:
            raise DataError(f"{where}.sample_by: got {self.sample_by!r}, expected one of {SAMPLE_BY}")
        if not self.weight > 0:
            raise DataError(f"{where}.weight: must be > 0, got {self.weight}")

    @property
    def paths(self) -> list[str]:
        return [self.path] if isinstance(self.path, str) else [str(p) for p in self.path]


@dataclass
class TokenizerConfig:
    """Which tokenizer: a local tokenizer.json / HF tokenizer folder, or (path null) a byte-level BPE trained on the
    training sources and cached under <cache>/tokenizers/<fingerprint>/tokenizer.json."""

    path: Optional[str] = field(default=None, metadata={"resume": ("operational",)})
    vocab_size: int = 8192  # for the trained BPE (special tokens included)
    eos_token: str = "<|endoftext|>"  # the special token appended after each document
    special_tokens: List[str] = field(default_factory=list)  # extra special tokens for the trained BPE
    min_frequency: int = 2  # BPE merges need a pair seen at least this often
    train_chars: int = 200_000_000  # train the BPE on at most this many characters of the training sources
    train_on: List[str] = field(default_factory=list)  # names of the training sources the BPE learns from (empty: all),
    # e.g. [plays] so a synthetic source mixed into the data does not shape the vocabulary

    def validate(self, where: str) -> None:
        if not 1 <= self.vocab_size <= MAX_VOCAB:
            raise DataError(
                f"{where}.vocab_size: got {self.vocab_size}, expected 1 to {MAX_VOCAB:,} tokens (a byte-level BPE "
                f"holds at least its 256 byte tokens and its special tokens; a smaller size grows to that, with a "
                f"warning)"
            )
        if self.min_frequency < 0:
            raise DataError(f"{where}.min_frequency: got {self.min_frequency}, expected 0 or more")


@dataclass
class DataConfig:
    """The training stream: a weighted mixture of sources, packed into windows of seq_len+1 tokens."""

    name: str = "custom"  # what the data config calls itself: shown in logs; data prepare's default out folder
    seq_len: int = 256  # windows hold seq_len + 1 tokens (inputs and shifted targets)
    seed: int = 1234  # file order per epoch and mixture draws
    sources: List[Any] = field(default_factory=list)  # SourceConfig nodes
    val: List[Any] = field(default_factory=list)  # held-out SourceConfig nodes, read once in order
    val_fraction: float = (
        0.0  # with val empty: hold out this share of the training documents (by a hash of each) for validation
    )
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    # DataLoader worker processes per rank (0 = tokenize in the training process)
    num_workers: int = field(default=1, metadata={"resume": ("operational",)})
    # fail (one line, non-zero exit) when no batch comes from the workers for this long; 0 = wait forever
    worker_timeout_s: float = field(default=600.0, metadata={"resume": ("operational",)})
    # a JSONL line that is not valid JSON: error (stop, naming file:line) | skip (skip it, count it, go on)
    on_bad_record: str = field(default="error", metadata={"resume": ("operational",)})
    num_streams: Optional[int] = None  # independent packed streams; null -> world_size * max(1, num_workers)
    shuffle_files: bool = True  # reshuffle each stream's file order every epoch (seeded)
    epochs: Optional[int] = None  # null = loop forever (training); N = stop after N passes
    tokenize_chars: int = 1 << 20  # tokenize documents in batches of about this many characters
    prepared_dir: Optional[str] = None  # read pre-tokenized shards written by `diffllm data prepare` from here
    ignore_fingerprint: bool = False  # resume even though the sources or tokenizer changed since the state was saved
    resume: bool = True  # false: ignore a saved data state and start the stream afresh (repeats data)
    doc_mask: bool = (
        False  # attention stays within each packed document (false: across documents, as the paper trained)
    )
    restart_positions: bool = False  # with doc_mask: rotary positions restart at 0 at each document start
    loss_on: str = "all"  # all: every target token counts | marked: only the tokens a source marks (e.g. answers)

    def __post_init__(self) -> None:
        from ..config import build

        if not isinstance(self.tokenizer, TokenizerConfig):
            self.tokenizer = build(TokenizerConfig, self.tokenizer, "data.tokenizer")
        self.sources = [self._source(s, f"data.sources[{i}]") for i, s in enumerate(self.sources)]
        self.val = [self._source(s, f"data.val[{i}]") for i, s in enumerate(self.val)]
        self.validate()

    @staticmethod
    def _source(node: Any, where: str) -> SourceConfig:
        from ..config import build

        if isinstance(node, SourceConfig):
            return node
        try:
            src = build(SourceConfig, node, where)
        except ValueError as e:
            raise DataError(str(e)) from None
        src.validate(where)
        if not src.name:
            first = src.paths[0]
            src.name = first if src.format == "hub" else Path(first.replace("*", "all")).stem
        return src

    @property
    def holds_out(self) -> bool:
        """Validation is a hashed share of the training documents (data.val_fraction), which training then skips."""
        return self.val_fraction > 0 and not self.val

    def validate(self) -> None:
        if self.seq_len < 1:
            raise DataError(f"data.seq_len: must be >= 1, got {self.seq_len}")
        if self.num_workers < 0:
            raise DataError(f"data.num_workers: must be >= 0, got {self.num_workers}")
        if not 0 <= self.val_fraction < 1:
            raise DataError(f"data.val_fraction: must be in [0, 1), got {self.val_fraction}")
        if self.val_fraction and self.val:
            raise DataError(
                f"data.val_fraction={self.val_fraction} holds out training documents only when data.val is "
                "empty; set data.val=[] to use it, or data.val_fraction=0 to keep the configured data.val"
            )
        if self.worker_timeout_s < 0:
            raise DataError(f"data.worker_timeout_s: must be >= 0 (0 = wait forever), got {self.worker_timeout_s}")
        if self.on_bad_record not in ON_BAD_RECORD:
            raise DataError(f"data.on_bad_record: got {self.on_bad_record!r}, expected one of {ON_BAD_RECORD}")
        if self.loss_on not in LOSS_ON:
            raise DataError(f"data.loss_on: got {self.loss_on!r}, expected one of {LOSS_ON}")
        if self.restart_positions and not self.doc_mask:
            raise DataError(
                "data.restart_positions=true needs data.doc_mask=true (positions restart per document only "
                "when attention stays within documents)"
            )
        if self.num_streams is not None and self.num_streams < 1:
            raise DataError(f"data.num_streams: must be >= 1 or null, got {self.num_streams}")
        names = [s.name for s in self.sources + self.val]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise DataError(f"data: source name {dup[0]!r} is used twice; give each source a unique `name`")
