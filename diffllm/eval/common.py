"""What every evaluation shares: its one-line error (EvalError), loading a run, writing results, and the batched,
gradient-free scorer (log-probabilities of target tokens) that perplexity, needles and lm-eval all use. Each command's
`key=value` line is diffllm.config.run_key_values on the dataclass its registry entry names."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..errors import UserError

if TYPE_CHECKING:
    import torch


class EvalError(UserError):
    """Bad evaluation input: the message is one line naming the key or file and the problem."""


def load_run(run: str, step: Any = "latest", check: Optional[Callable[[Any, Any], None]] = None):
    """(Run, ModelConfig, DecoderLM, Tokenizer) of a run directory, or a one-line EvalError. `check(run, model
    config)`: the command's checks of its arguments, run before the checkpoint's weights are gathered (minutes for a
    large ZeRO checkpoint), so that a bad argument answers at once."""
    from ..runs import Run

    if not run:
        raise EvalError("run: missing; pass run=<run directory>")
    path = Path(run)
    if not path.exists():
        raise EvalError(f"run={run}: no such directory")
    r = Run(path)
    if check is not None:
        check(r, r.model_config(step))
    with library_output_to_stderr():  # DeepSpeed's zero_to_fp32 prints what it converts
        cfg, model, tok = r.model(step=step)
    return r, cfg, model, tok


@contextlib.contextmanager
def library_output_to_stderr():
    """Inside: what libraries print (DeepSpeed's zero_to_fp32 `print`s, its logger's stdout handler) goes to stderr,
    so a command's stdout holds only its own output (`diffllm generate ... > out.txt`)."""
    handlers = [
        h
        for h in logging.getLogger("DeepSpeed").handlers
        if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.__stdout__)
    ]
    saved = [h.stream for h in handlers]
    for h in handlers:
        h.stream = sys.stderr
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for h, stream in zip(handlers, saved):
            h.stream = stream


def say(msg: str) -> None:
    print(f"[diffllm.eval] {msg}", file=sys.stderr, flush=True)


def write_json(path: Path, obj: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")
    return path


def write_report(folder: Path, stem: str, res: dict, table: str) -> None:
    """<folder>/<stem>.json (the results) and <stem>.md (the markdown table), and the table on stdout."""
    write_json(Path(folder) / f"{stem}.json", res)
    (Path(folder) / f"{stem}.md").write_text(table + "\n")
    print(table)


def read_json_or_none(path: Path) -> Any:
    """A results file, or None when it does not exist; a damaged one is a one-line EvalError."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise EvalError(f"{path}: not valid JSON; delete it to recompute") from None


def inference_mode(fn: Callable) -> Callable:
    """`fn` under torch.inference_mode(), torch imported when it first runs: the eval modules import no torch at
    import time, so a command's --help (which imports its module for the typed config) answers at once."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        import torch

        with torch.inference_mode():
            return fn(*args, **kwargs)

    return run


def out_dir(out: Optional[str], run_dir: Path) -> Path:
    """Where a command writes its results: `out`, or <run>/eval/."""
    return Path(out) if out else Path(run_dir) / "eval"


@inference_mode
def target_logprobs(model: torch.nn.Module, tokens: torch.Tensor, **model_kwargs) -> torch.Tensor:
    """log p(tokens[:, t+1] | tokens[:, :t+1]) in fp32: tokens (B, T+1) -> (B, T). model_kwargs: document ids
    (Batch.model_kwargs())."""
    import torch
    import torch.nn.functional as F

    logits = model(tokens[:, :-1], **model_kwargs).float()  # (B, T, V)
    B, T, V = logits.shape
    rows, targets = logits.view(B * T, V), tokens[:, 1:].reshape(B * T)
    # over contiguous rows, as the trainer's loss (4x faster on CPU than over the transposed (B, V, T) view), a few
    # MB of rows at a time: log_softmax's temporary stays in cache (row by row, so the numbers do not change)
    step = max(1, (1 << 21) // V)
    return -torch.cat(
        [F.cross_entropy(rows[i : i + step], targets[i : i + step], reduction="none") for i in range(0, B * T, step)]
    ).view(B, T)  # (B, T)


def padded(seqs: list[list[int]]) -> torch.Tensor:
    """Right-padded (B, W) token tensor; a causal model's logits at a real position never see the padding."""
    import torch

    tokens = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=torch.long)
    for j, s in enumerate(seqs):
        tokens[j, : len(s)] = torch.tensor(s)
    return tokens


@inference_mode
def score_continuations(
    model: torch.nn.Module, pairs: list[tuple[list[int], list[int]]], max_len: int, batch_size: int = 16
) -> list[tuple[float, bool]]:
    """(sum log p(continuation | context), continuation is the greedy choice) for each (context, continuation) pair.
    The last `max_len` + 1 tokens are kept (the context is cut on the left). This is the scorer of lm-eval's
    loglikelihood and the reference of our own multiple-choice scoring."""
    import torch

    out: list[tuple[float, bool]] = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        seqs = [(ctx + cont)[-(max_len + 1) :] for ctx, cont in chunk]
        logits = model(padded(seqs)[:, :-1]).float().log_softmax(-1)  # (B, W-1, V)
        for j, ((_, cont), s) in enumerate(zip(chunk, seqs)):
            n = len(cont)
            rows = logits[j, len(s) - 1 - n : len(s) - 1]  # (n, V): the positions that predict the continuation
            target = torch.tensor(cont)
            out.append((float(rows.gather(-1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all())))
    return out


def data_config(run_config: Optional[dict], data: Any):
    """The DataConfig whose held-out sources are scored: a data config by name, the run's own, or files (a source
    each)."""
    from ..config import build, find_config, group_options, load_group
    from ..data import DataConfig

    if data is None:
        node = (run_config or {}).get("data")
        if not node:
            raise EvalError(
                "data: the run has no config.yaml to take its held-out sources from; pass data=<config name or files>"
            )
        return build(DataConfig, node, "data")
    if isinstance(data, str) and find_config("data", data) is not None:  # along the search path, as data=<name>
        return build(DataConfig, load_group("data", data), f"data={data}")
    paths = [data] if isinstance(data, str) else list(data)
    if isinstance(data, str) and "/" not in data and "." not in data:
        raise EvalError(f"data={data}: neither a data config ({', '.join(group_options('data'))}) nor a file")
    return DataConfig(sources=[], val=[{"path": p} for p in paths])


def documents(tok, src):
    """(token ids, the document as read: text or ids) of each non-empty document of source `src`, in file order."""
    from ..data.sources import Reader

    reader = Reader(src, tok.fingerprint)
    for f in range(src.n_files):
        for _, doc, _ in reader.docs(f, 0, 1):
            if doc is not None and len(doc):
                yield (tok.encode(doc) if isinstance(doc, str) else [int(t) for t in doc]), doc
