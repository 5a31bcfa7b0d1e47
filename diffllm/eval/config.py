"""The eval commands' typed configs (`diffllm eval ppl|needle|recall|attention|outliers key=value`), apart from the code
that runs them: --help reads them (diffllm/cli/registry.py names them here) without importing torch. Their checks
import what they need when they run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from .common import EvalError

MODES = ("synthetic", "text")  # eval needle's haystacks
CITIES = tuple(  # eval needle mode=text: the needles' values
    (
        "Paris London Rome Madrid Berlin Vienna Prague Lisbon Dublin Oslo Athens "
        "Cairo Tokyo Lima Sydney Toronto Boston Chicago Denver Seattle Mumbai Delhi "
        "Moscow Warsaw Geneva Milan Naples Venice Florence Bristol Leeds York"
    ).split()
)


@dataclass
class NeedleTask:
    """The grid: accuracy for every N x depth x length, `trials` prompts per cell, min(queries, N) queries each."""

    mode: str = "synthetic"  # synthetic | text
    n_needles: List[int] = field(default_factory=lambda: [1, 2, 4])  # N: needles per prompt
    queries: int = 1  # R (the paper: 1 at N=1, 2 otherwise)
    # where the queried needle sits, % of the context
    depths: List[float] = field(default_factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0])
    lengths: Optional[List[int]] = None  # null: 64, 128, ... up to the model's context
    trials: int = 8  # prompts per N x depth x length cell
    seed: int = 0  # the prompts' generator
    batch_size: int = 8  # prompts per forward

    def resolved_lengths(self, max_seq_len: int) -> List[int]:
        if self.lengths:
            too_long = [x for x in self.lengths if x > max_seq_len]
            if too_long:
                raise EvalError(f"lengths: {too_long[0]} exceeds the model's context ({max_seq_len})")
            return list(self.lengths)
        out, x = [], 64
        while x < max_seq_len:
            out.append(x)
            x *= 2
        return out + [max_seq_len]

    def validate(self) -> None:
        from ..data.needle import KEYS

        if self.mode not in MODES:
            raise EvalError(f"mode={self.mode!r}: expected one of {MODES}")
        limit = len(KEYS) if self.mode == "synthetic" else len(CITIES)
        if not self.n_needles or any(not 1 <= n <= limit for n in self.n_needles):
            raise EvalError(f"n_needles={self.n_needles}: each must be in 1..{limit}")
        if any(not 0 <= d <= 100 for d in self.depths):
            raise EvalError(f"depths={self.depths}: each must be in 0..100 (percent)")
        if self.queries < 1 or self.trials < 1:
            raise EvalError("queries and trials must be >= 1")


@dataclass
class NeedleConfig(NeedleTask):
    """Multi-needle retrieval: accuracy by N x depth x length (JSON, markdown table, heatmap PNG)."""

    run: str = ""  # a run directory (or its checkpoints/step<N> folder)
    step: Any = "latest"  # latest, or a checkpoint's step number
    data: Any = None  # mode=text: data config name or files for the haystack (default: the run's held-out text)
    out: Optional[str] = None  # folder for needle-<mode>.{json,md,png}; null: <run>/eval


@dataclass
class RecallTask:
    """The grid: accuracy for every N x gap x length, `trials` held-out prompts per cell."""

    n: List[int] = field(default_factory=lambda: [2, 4, 8])  # key-value pairs per prompt (every key is queried)
    gaps: List[int] = field(default_factory=lambda: [0, 16])  # filler words between the pairs and the queries
    lengths: List[int] = field(default_factory=lambda: [64])  # words per prompt
    trials: int = 32  # prompts per cell
    seed: int = 0  # the prompts' generator (held-out binding sets whatever the seed)
    batch_size: int = 8  # prompts per forward
    bootstrap: int = 1000  # resamples for the intervals (0: none)
    level: float = 0.95  # interval coverage

    def validate(self) -> None:
        if not self.n or not self.gaps or not self.lengths:
            raise EvalError("n, gaps and lengths must be non-empty lists")
        if self.trials < 1 or self.batch_size < 1 or self.bootstrap < 0 or not 0 < self.level < 1:
            raise EvalError("trials and batch_size must be >= 1, bootstrap >= 0, 0 < level < 1")
        from ..data.recall import check

        for n in self.n:
            for gap in self.gaps:
                for length in self.lengths:
                    try:
                        check(int(n), int(gap), int(length), "test")
                    except ValueError as e:
                        raise EvalError(str(e)) from None


@dataclass
class RecallConfig(RecallTask):
    """Associative recall on held-out binding sets: accuracy by N x gap x length with bootstrap intervals."""

    run: str = ""  # a run directory (or its checkpoints/step<N> folder)
    step: Any = "latest"  # latest, or a checkpoint's step number
    out: Optional[str] = None  # folder for recall.{json,md}; null: <run>/eval


@dataclass
class AttentionConfig:
    """Attention to the answer (needle, or recall pair) vs the rest of the context, per layer, depth or N x gap."""

    run: str = ""  # a run directory (or its checkpoints/step<N> folder)
    step: Any = "latest"  # latest, or a checkpoint's step number
    task: str = "needle"  # needle | recall (the associative-recall task's held-out prompts, see eval recall)
    mode: str = "synthetic"  # needle: synthetic | text (see eval needle)
    # needle mode=text: the text the needles hide in (a data config name or files); null: the run's held-out sources
    data: Any = None
    n_needles: int = 1  # needle: needles per prompt
    # needle: where the needle sits, % of the context
    depths: List[float] = field(default_factory=lambda: [0.0, 25.0, 50.0, 75.0, 100.0])
    n: List[int] = field(default_factory=lambda: [2, 4, 8])  # recall: key-value pairs per prompt
    gaps: List[int] = field(default_factory=lambda: [0, 16])  # recall: filler words between pairs and queries
    length: Optional[int] = None  # needle: tokens (null: the model's context); recall: words (null: 64)
    trials: int = 4  # prompts per depth (needle) or per N x gap (recall)
    seed: int = 0  # the prompts' generator
    out: Optional[str] = None  # folder for the results; null: <run>/eval


@dataclass
class OutliersConfig:
    """Activation outliers (top-k and median of attention logits and hidden states) and the loss after absmax
    quantisation of attention logits, over held-out windows (default: the run's held-out sources), and the
    plays_cloze accuracy under the same quantisation."""

    run: str = ""  # a run directory (or its checkpoints/step<N> folder)
    step: Any = "latest"  # latest, or a checkpoint's step number
    data: Any = None  # null: the run's held-out sources | a data config name | files/globs
    tokens: int = 16384  # the token sample (the paper: 0.4M)
    seq_len: Optional[int] = None  # null: the run's data.seq_len
    batch_size: int = 4  # windows per forward
    # attention-logit quantisation widths (absmax, per head) the loss is measured at
    bits: List[int] = field(default_factory=lambda: [16, 8, 6, 4])
    # plays_cloze items (of 300) whose accuracy is measured at fp32 and each width (chance 0.25); 0: none
    cloze_items: int = 300
    out: Optional[str] = None  # folder for outliers.json; null: <run>/eval


@dataclass
class PplConfig:
    """Loss, perplexity and bits per byte per source. data: a data config name (its held-out `val` sources), or
    files/globs (one source each); default: the run's own held-out sources."""

    run: str = ""  # a run directory (or its checkpoints/step<N> folder)
    step: Any = "latest"  # latest, or a checkpoint's step number
    data: Any = None  # null | shakespeare | path/to/*.txt | [a.txt, b.jsonl]
    seq_len: Optional[int] = None  # null: the run's data.seq_len
    batch_size: int = 8  # windows per forward (on CPU 8 beats 32: the logits stay smaller; scripts/bench_eval.py)
    max_tokens: Optional[int] = None  # per source; null: every document (every held-out window)
    whole: bool = False  # with a data.val_fraction config: score every document of its sources (mostly training
    # text), not only the windows the trainer held out
    doc_mask: Optional[bool] = None  # attention within documents; null: as the run trained (its data.doc_mask)
    out: Optional[str] = None  # folder for ppl.json; null: <run>/eval
    by_position: bool = False  # NLL by token position over documents >= seq_len tokens (seq_len may exceed the
    # training length: extrapolation, labelled) -> ppl_by_position.{json,md,png} (diffllm/eval/by_position.py)
    max_docs: Optional[int] = None  # by_position: documents per source; null: every long enough one
