"""`diffllm eval ppl`: loss, perplexity and bits per byte of a trained model, per source, batched and gradient-free.

Each source's documents are joined as  EOS d1 EOS d2 EOS ...  and cut into windows of seq_len + 1 tokens that overlap
by one token, so every document token is predicted exactly once (the EOS separators are context, never targets).
Bits per byte = (summed nats over document tokens) / ln 2 / (UTF-8 bytes of those documents): it does not depend on
the tokenizer, so runs with different tokenizers compare.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

from ..config import run_key_values
from .common import EvalError, data_config, documents, load_run, out_dir, say, target_logprobs, write_json
from .config import PplConfig

if TYPE_CHECKING:  # numpy and torch are imported where they are used: `eval ppl --help` imports this module
    import torch

    from ..data import Batch


def perplexity(
    model: torch.nn.Module, batches: Iterable[Batch], n_bytes: Optional[int] = None, progress: Any = None
) -> dict:
    """{loss, ppl, tokens[, bits_per_byte]} over Batches of windows (B, T+1): their counted targets (a Batch's
    loss_mask; all targets without one), with their document ids when they carry them. Gradient-free; the model runs
    with its own (sdpa/flash) kernel. A plain function for in-loop evaluation."""
    nats, count = summed_nats(model, batches, progress)
    if count == 0:
        raise EvalError("perplexity: no tokens to score")
    out = {"loss": nats / count, "ppl": math.exp(min(nats / count, 700.0)), "tokens": count}
    if n_bytes:
        out["bits_per_byte"] = nats / math.log(2) / n_bytes
        out["bytes"] = n_bytes
    return out


def summed_nats(model: torch.nn.Module, batches: Iterable[Batch], progress: Any = None) -> tuple[float, int]:
    """(summed negative log-likelihood in nats, float64, of the counted targets; their count) over `batches`: what
    `perplexity` divides, and what the trainer's final validation sums over ranks."""
    nats, count = 0.0, 0
    for batch in batches:
        logp = target_logprobs(model, batch.tokens, **batch.model_kwargs()).double()  # (B, T)
        mask = batch.target_mask
        nats -= float(logp.sum() if mask is None else (logp * mask).sum())
        count += batch.loss_tokens()
        if progress is not None:
            progress.update(int(batch.targets.numel()))
    return nats, count


def windows(
    docs: Iterable[list[int]],
    eos: int,
    seq_len: int,
    batch_size: int,
    doc_mask: bool = False,
    restart_positions: bool = False,
) -> Iterator[Batch]:
    """Batches of windows (B, seq_len+1) of  EOS d1 EOS d2 ...; windows overlap by one token and the loss mask marks
    targets that are document tokens; with doc_mask, document ids from the EOS tokens (an EOS ends its document, as
    the packer's windows have them). The last window is shorter; batches are never padded."""
    import numpy as np
    import torch

    from ..data.batch import Batch

    stream = np.concatenate([np.asarray([eos] + list(d), dtype=np.int64) for d in docs])
    is_doc = np.ones(len(stream), dtype=bool)
    is_doc[stream == eos] = False

    def batch(idx: np.ndarray) -> Batch:  # idx (B, T+1) positions in the stream
        tokens = torch.from_numpy(stream[idx])
        ids = None
        if doc_mask:
            from ..model.documents import doc_ids_from_eos

            ids = doc_ids_from_eos(tokens, eos)
        return Batch(tokens, ids, torch.from_numpy(is_doc[idx]), restart_positions)

    starts = list(range(0, max(len(stream) - 1, 0), seq_len))
    full = [s for s in starts if s + seq_len + 1 <= len(stream)]
    for i in range(0, len(full), batch_size):
        yield batch(np.asarray(full[i : i + batch_size])[:, None] + np.arange(seq_len + 1))
    tail = [s for s in starts if s + seq_len + 1 > len(stream)]
    for s in tail:  # at most one short window
        yield batch(np.arange(s, len(stream))[None, :])


def source_docs(tok, src, max_tokens: Optional[int]) -> tuple[list[list[int]], int]:
    """The token ids of a source's documents (up to max_tokens document tokens) and their UTF-8 byte count."""
    docs, n_tokens, n_bytes = [], 0, 0
    for ids, doc in documents(tok, src):
        if max_tokens is not None and n_tokens + len(ids) > max_tokens:
            ids = ids[: max_tokens - n_tokens]
            doc = tok.decode(ids)
        elif not isinstance(doc, str):
            doc = tok.decode(ids)
        docs.append(ids)
        n_tokens += len(ids)
        n_bytes += len(doc.encode("utf-8"))
        if max_tokens is not None and n_tokens >= max_tokens:
            break
    return docs, n_bytes


def eval_sources(run_config: Optional[dict], data: Any) -> list:
    """Resolved held-out sources of `data_config` (with data.val_fraction: the training sources; their held-out
    documents are what `score_sets` reads, `source_docs` reads every document)."""
    from ..data.loader import resolve_sources

    return resolve_sources(data_config(run_config, data), val=True)


@dataclass
class ScoreSet:
    """One source's scored windows: (tokens, mask) batches, the UTF-8 bytes of the scored text, the tokens the
    progress bar counts, and what was scored, in words."""

    name: str
    batches: list
    n_bytes: int
    total: int
    what: str


def held_out_set(cfg, src, tok, seq_len: int, batch_size: int, max_tokens: Optional[int]) -> ScoreSet:
    """The windows the trainer holds out of `src` under data.val_fraction, packed by the trainer's own data code
    (diffllm.data.loader.val_windows): every target counts, EOS included, as in the trainer's val_loss."""
    import dataclasses

    import numpy as np

    from ..data.batch import Batch
    from ..data.loader import val_windows

    limit = None if max_tokens is None else max(1, max_tokens // seq_len)
    wins = val_windows([src], dataclasses.replace(cfg, seq_len=seq_len), tok, limit, f"held-out source {src.name!r}")
    if not wins:
        raise EvalError(f"data.val_fraction={cfg.val_fraction}: {src.name!r} holds out fewer than {seq_len + 1} tokens")
    n_bytes = sum(len(tok.decode([t for t in w[0, 1:].tolist() if t != tok.eos_id]).encode("utf-8")) for w in wins)
    every = dataclasses.replace(cfg, loss_on="all")  # perplexity: every target counts, whatever the run trained on
    batches = [Batch.from_windows(np.stack(wins[i : i + batch_size]), every) for i in range(0, len(wins), batch_size)]
    what = (
        f"held-out windows of {src.name} (data.val_fraction={cfg.val_fraction}): {len(wins):,} windows of "
        f"{seq_len + 1} tokens, {len(wins) * seq_len:,} target tokens"
    )
    return ScoreSet(src.name, batches, n_bytes, len(wins) * seq_len, what)


def score_sets(
    run_config: Optional[dict],
    data: Any,
    tok,
    seq_len: int,
    batch_size: int,
    max_tokens: Optional[int] = None,
    whole: bool = False,
    doc_mask: Optional[bool] = None,
    restart_positions: Optional[bool] = None,
) -> list[ScoreSet]:
    """What `eval ppl` scores, per held-out source: with data.val_fraction (and not `whole`) the windows the trainer
    held out; otherwise every document of each held-out source (files given as data=: each file whole). doc_mask,
    restart_positions: attention within documents (null: as the scored data config says)."""
    import dataclasses

    from ..data.loader import resolve_sources

    cfg = data_config(run_config, data)
    if doc_mask is not None:
        restart = cfg.restart_positions if restart_positions is None else restart_positions
        cfg = dataclasses.replace(cfg, doc_mask=doc_mask, restart_positions=doc_mask and restart)
    out = []
    for src in resolve_sources(cfg, val=True):
        if cfg.holds_out and not whole:
            out.append(held_out_set(cfg, src, tok, seq_len, batch_size, max_tokens))
            continue
        docs, n_bytes = source_docs(tok, src, max_tokens)
        what = (
            f"every document of {src.name}"
            + (
                f" (whole=true: a training source; data.val_fraction={cfg.val_fraction} held out only part of it)"
                if cfg.holds_out
                else ""
            )
            + f": {sum(len(d) for d in docs):,} document tokens"
        )
        batches = windows(docs, tok.eos_id, seq_len, batch_size, cfg.doc_mask, cfg.restart_positions)
        out.append(ScoreSet(src.name, list(batches), n_bytes, sum(len(d) + 1 for d in docs), what))
    return out


def run_score_sets(
    run_config: Optional[dict],
    tok,
    seq_len: int,
    batch_size: int,
    max_tokens: Optional[int] = None,
    data: Any = None,
    whole: bool = False,
    doc_mask: Optional[bool] = None,
) -> tuple[list[ScoreSet], bool]:
    """What `eval ppl` scores on a run (its own held-out set unless `data`), with the run's document masks unless
    doc_mask says otherwise; and whether they are on. The trainer's final validation is this call."""
    train_data = (run_config or {}).get("data") or {}
    doc_mask = train_data.get("doc_mask", False) if doc_mask is None else doc_mask
    restart = doc_mask and train_data.get("restart_positions", False)
    sets = score_sets(run_config, data, tok, seq_len, batch_size, max_tokens, whole, doc_mask, restart)
    return sets, doc_mask


def run_ppl(c: PplConfig) -> dict:
    from ..data.progress import progress

    def check(run, mcfg) -> None:  # the arguments, before the weights are gathered
        if c.batch_size < 1:
            raise EvalError(f"batch_size={c.batch_size}: must be >= 1")
        if the_seq_len(run, mcfg) > mcfg.max_seq_len:
            raise EvalError(f"seq_len={the_seq_len(run, mcfg)}: longer than the model's context ({mcfg.max_seq_len})")
        eval_sources(run.config(), c.data)  # a data config that does not exist, a glob that matches nothing

    def the_seq_len(run, mcfg) -> int:
        return c.seq_len or ((run.config() or {}).get("data") or {}).get("seq_len") or mcfg.max_seq_len

    if c.by_position:
        from .by_position import run_by_position

        return run_by_position(c, the_seq_len)
    run, mcfg, model, tok = load_run(c.run, c.step, check)
    run_cfg = run.config()
    seq_len = the_seq_len(run, mcfg)
    results: dict = {
        "run": str(run.dir),
        "step": run.checkpoint(c.step).step,
        "arch": mcfg.arch,
        "model": mcfg.name,
        "seq_len": seq_len,
        "sources": {},
    }
    sets, doc_mask = run_score_sets(run_cfg, tok, seq_len, c.batch_size, c.max_tokens, c.data, c.whole, c.doc_mask)
    results["doc_mask"] = doc_mask
    for s in sets:
        say(f"scoring {s.what}")
        t0 = time.perf_counter()
        with progress(s.total, f"ppl {s.name}") as bar:  # a bar on a terminal, plain lines in a log
            res = perplexity(model, s.batches, s.n_bytes, bar)
        res["tokens_per_s"] = round(s.total / (time.perf_counter() - t0))
        res["scored"] = s.what
        results["sources"][s.name] = res
        say(
            f"{s.name}: loss {res['loss']:.4f} | ppl {res['ppl']:.2f} | bits/byte {res['bits_per_byte']:.4f} | "
            f"{res['tokens']:,} tokens, {s.n_bytes:,} bytes | {res['tokens_per_s']:,} tok/s"
        )
    path = write_json(out_dir(c.out, run.dir) / "ppl.json", results)
    say(f"wrote {path}")
    return results


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("eval ppl", PplConfig, run_ppl, argv)


if __name__ == "__main__":
    main()
