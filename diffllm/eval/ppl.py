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
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch

from .common import EvalError, cli, load_run, out_dir, say, target_logprobs, write_json


@dataclass
class PplConfig:
    """Loss, perplexity and bits per byte per source. data: a data config name (its held-out `val` sources), or
    files/globs (one source each); default: the run's own held-out sources."""

    run: str = ""
    step: Any = "latest"
    data: Any = None  # null | shakespeare | path/to/*.txt | [a.txt, b.jsonl]
    seq_len: Optional[int] = None  # null: the run's data.seq_len
    batch_size: int = 8  # windows per forward (on CPU 8 beats 32: the logits stay smaller; scripts/bench_eval.py)
    max_tokens: Optional[int] = None  # per source; null: every document (every held-out window)
    whole: bool = False  # with a data.val_fraction config: score every document of its sources (mostly training
    # text), not only the windows the trainer held out
    out: Optional[str] = None  # folder for ppl.json; null: <run>/eval


def perplexity(model: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
               n_bytes: Optional[int] = None, progress: Any = None) -> dict:
    """{loss, ppl, tokens[, bits_per_byte]} over `batches` of (tokens (B, T+1), mask (B, T) of the counted targets).
    Gradient-free; the model runs with its own (sdpa/flash) kernel. A plain function for in-loop evaluation."""
    nats, count = 0.0, 0
    for tokens, mask in batches:
        logp = target_logprobs(model, tokens)  # (B, T)
        nats -= float((logp.double() * mask).sum())
        count += int(mask.sum())
        if progress is not None:
            progress.update(int(tokens[:, 1:].numel()))
    if count == 0:
        raise EvalError("perplexity: no tokens to score")
    out = {"loss": nats / count, "ppl": math.exp(min(nats / count, 700.0)), "tokens": count}
    if n_bytes:
        out["bits_per_byte"] = nats / math.log(2) / n_bytes
        out["bytes"] = n_bytes
    return out


def windows(docs: Iterable[list[int]], eos: int, seq_len: int, batch_size: int
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(tokens (B, seq_len+1), mask (B, seq_len)) batches of  EOS d1 EOS d2 ...; windows overlap by one token and
    the mask marks targets that are document tokens. The last window is shorter; batches are never padded."""
    stream = np.concatenate([np.asarray([eos] + list(d), dtype=np.int64) for d in docs])
    is_doc = np.ones(len(stream), dtype=bool)
    is_doc[stream == eos] = False
    starts = list(range(0, max(len(stream) - 1, 0), seq_len))
    full = [s for s in starts if s + seq_len + 1 <= len(stream)]
    for i in range(0, len(full), batch_size):
        idx = np.asarray(full[i : i + batch_size])[:, None] + np.arange(seq_len + 1)  # (B, T+1)
        yield torch.from_numpy(stream[idx]), torch.from_numpy(is_doc[idx[:, 1:]])
    tail = [s for s in starts if s + seq_len + 1 > len(stream)]
    for s in tail:  # at most one short window
        yield torch.from_numpy(stream[None, s:]), torch.from_numpy(is_doc[None, s + 1 :])


def source_docs(tok, src, max_tokens: Optional[int]) -> tuple[list[list[int]], int]:
    """The token ids of a source's documents (up to max_tokens document tokens) and their UTF-8 byte count."""
    from ..data.sources import Reader

    reader, docs, n_tokens, n_bytes = Reader(src, tok.fingerprint), [], 0, 0
    for f in range(src.n_files):
        for _, doc, _ in reader.docs(f, 0, 1):
            if doc is None or len(doc) == 0:
                continue
            ids = tok.encode(doc) if isinstance(doc, str) else [int(t) for t in doc]
            if max_tokens is not None and n_tokens + len(ids) > max_tokens:
                ids = ids[: max_tokens - n_tokens]
                doc = tok.decode(ids)
            elif not isinstance(doc, str):
                doc = tok.decode(ids)
            docs.append(ids)
            n_tokens += len(ids)
            n_bytes += len(doc.encode("utf-8"))
            if max_tokens is not None and n_tokens >= max_tokens:
                return docs, n_bytes
    return docs, n_bytes


def data_config(run_config: Optional[dict], data: Any):
    """The DataConfig whose held-out sources are scored: a data config by name, the run's own, or files (a source each)."""
    from ..config import build, find_config, group_options, load_group
    from ..data import DataConfig

    if data is None:
        node = (run_config or {}).get("data")
        if not node:
            raise EvalError("data: the run has no config.yaml to take its held-out sources from; pass data=<config "
                            "name or files>")
        return build(DataConfig, node, "data")
    if isinstance(data, str) and find_config("data", data) is not None:  # along the search path, as data=<name>
        return build(DataConfig, load_group("data", data), f"data={data}")
    paths = [data] if isinstance(data, str) else list(data)
    if isinstance(data, str) and "/" not in data and "." not in data:
        raise EvalError(f"data={data}: neither a data config ({', '.join(group_options('data'))}) nor a file")
    return DataConfig(sources=[], val=[{"path": p} for p in paths])


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

    from ..data.loader import val_windows

    limit = None if max_tokens is None else max(1, max_tokens // seq_len)
    wins = val_windows([src], dataclasses.replace(cfg, seq_len=seq_len), tok, limit, f"held-out source {src.name!r}")
    if not wins:
        raise EvalError(f"data.val_fraction={cfg.val_fraction}: {src.name!r} holds out fewer than {seq_len + 1} tokens")
    tokens = torch.from_numpy(np.stack(wins)).long()  # (N, T+1)
    n_bytes = sum(len(tok.decode([t for t in w[1:].tolist() if t != tok.eos_id]).encode("utf-8")) for w in wins)
    batches = [(tokens[i : i + batch_size], torch.ones(len(tokens[i : i + batch_size]), seq_len, dtype=torch.bool))
               for i in range(0, len(tokens), batch_size)]
    what = (f"held-out windows of {src.name} (data.val_fraction={cfg.val_fraction}): {len(wins):,} windows of "
            f"{seq_len + 1} tokens, {len(wins) * seq_len:,} target tokens")
    return ScoreSet(src.name, batches, n_bytes, int(tokens[:, 1:].numel()), what)


def score_sets(run_config: Optional[dict], data: Any, tok, seq_len: int, batch_size: int,
               max_tokens: Optional[int] = None, whole: bool = False) -> list[ScoreSet]:
    """What `eval ppl` scores, per held-out source: with data.val_fraction (and not `whole`) the windows the trainer
    held out; otherwise every document of each held-out source (files given as data=: each file whole)."""
    from ..data.loader import resolve_sources

    cfg = data_config(run_config, data)
    out = []
    for src in resolve_sources(cfg, val=True):
        if cfg.holds_out and not whole:
            out.append(held_out_set(cfg, src, tok, seq_len, batch_size, max_tokens))
            continue
        docs, n_bytes = source_docs(tok, src, max_tokens)
        what = (f"every document of {src.name}" + (" (whole=true: a training source; data.val_fraction="
                                                    f"{cfg.val_fraction} held out only part of it)" if cfg.holds_out else "")
                + f": {sum(len(d) for d in docs):,} document tokens")
        out.append(ScoreSet(src.name, list(windows(docs, tok.eos_id, seq_len, batch_size)), n_bytes,
                            sum(len(d) + 1 for d in docs), what))
    return out


def run_ppl(c: PplConfig) -> dict:
    from tqdm import tqdm

    run, mcfg, model, tok = load_run(c.run, c.step)
    run_cfg = run.config()
    seq_len = c.seq_len or ((run_cfg or {}).get("data") or {}).get("seq_len") or mcfg.max_seq_len
    if seq_len > mcfg.max_seq_len:
        raise EvalError(f"seq_len={seq_len}: longer than the model's context ({mcfg.max_seq_len})")
    results: dict = {"run": str(run.dir), "step": run.checkpoint(c.step).step, "arch": mcfg.arch, "model": mcfg.name,
                     "seq_len": seq_len, "sources": {}}
    for s in score_sets(run_cfg, c.data, tok, seq_len, c.batch_size, c.max_tokens, c.whole):
        say(f"scoring {s.what}")
        t0 = time.perf_counter()
        with tqdm(total=s.total, desc=f"ppl {s.name}", unit="tok", unit_scale=True, leave=False) as bar:
            res = perplexity(model, s.batches, s.n_bytes, bar)
        res["tokens_per_s"] = round(s.total / (time.perf_counter() - t0))
        res["scored"] = s.what
        results["sources"][s.name] = res
        say(f"{s.name}: loss {res['loss']:.4f} | ppl {res['ppl']:.2f} | bits/byte {res['bits_per_byte']:.4f} | "
            f"{res['tokens']:,} tokens, {s.n_bytes:,} bytes | {res['tokens_per_s']:,} tok/s")
    path = write_json(out_dir(c.out, run.dir) / "ppl.json", results)
    say(f"wrote {path}")
    return results


def main(argv: Optional[list[str]] = None) -> None:
    cli("eval ppl", PplConfig, run_ppl, argv)


if __name__ == "__main__":
    main()
