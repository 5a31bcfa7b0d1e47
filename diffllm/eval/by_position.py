"""`diffllm eval ppl by_position=true`: negative log-likelihood as a function of token position (the paper's Figure 4).

Each source's documents at least `seq_len` tokens long are cut to their first `seq_len` tokens and scored as one window
EOS d[0] ... d[seq_len-1], so position t (1-based) is the t-th token of a document, predicted from the t-1 tokens before
it (and the EOS that starts every document, as in training). Per source: the NLL at each position averaged over the
documents, the cumulative average NLL (mean over positions 1..t of that curve) and the NLL per bucket of positions
(powers of two: 1, 2-3, 4-7, ...) with its standard error over documents. A `seq_len` beyond the run's training
length (data.seq_len) is allowed, even beyond model.max_seq_len: RoPE is applied as trained (same theta, no scaling)
and the output marks those positions as extrapolation. Shorter documents are skipped (the count is reported), never
padded or truncated into the curve; a source without any long enough document is a one-line error.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any, Optional

from .common import EvalError, data_config, documents, inference_mode, load_run, out_dir, say, write_report

if TYPE_CHECKING:
    import numpy as np
    import torch

    from .config import PplConfig

STEM = "ppl_by_position"


def buckets(T: int) -> list[tuple[int, int]]:
    """1-based position ranges [lo, hi] of powers of two up to T: (1, 1), (2, 3), (4, 7), ... (2^k, T)."""
    out, lo = [], 1
    while lo <= T:
        out.append((lo, min(2 * lo - 1, T)))
        lo *= 2
    return out


def long_docs(tok, src, seq_len: int, max_docs: Optional[int]) -> tuple[list[list[int]], int, int]:
    """(the first seq_len tokens of each document of `src` at least seq_len tokens long (up to max_docs), the number of
    shorter documents skipped, the longest document's length)."""
    kept, skipped, longest = [], 0, 0
    for ids, _ in documents(tok, src):
        longest = max(longest, len(ids))
        if len(ids) < seq_len:
            skipped += 1
            continue
        kept.append(ids[:seq_len])
        if max_docs is not None and len(kept) >= max_docs:
            break
    return kept, skipped, longest


@inference_mode
def window_nll(model: torch.nn.Module, tokens: torch.Tensor, **model_kwargs) -> torch.Tensor:
    """-log p(tokens[:, t+1] | tokens[:, :t+1]) in float64: tokens (B, T+1) -> (B, T). The log-softmax runs in the
    logits' precision (float32, float64 for a float64 model), a few MB of rows at a time."""
    import torch

    logits = model(tokens[:, :-1], **model_kwargs)  # (B, T, V)
    logits = logits if logits.dtype == torch.float64 else logits.float()
    B, T, V = logits.shape
    rows, targets = logits.reshape(B * T, V), tokens[:, 1:].reshape(B * T, 1)
    step = max(1, (1 << 21) // V)
    out = [-rows[i : i + step].log_softmax(-1).gather(-1, targets[i : i + step])[:, 0] for i in range(0, B * T, step)]
    return torch.cat(out).double().view(B, T)


def score_docs(
    model, docs: list[list[int]], eos: int, batch_size: int, doc_mask: bool = False, restart: bool = False, bar=None
) -> np.ndarray:
    """(D, T) float64 NLL of each document's tokens, each document (all of length T) a window EOS d[0] ... d[T-1];
    with doc_mask, document ids from the EOS (as the run trained: the leading EOS belongs to the document it ends)."""
    import numpy as np
    import torch

    rows = []
    for i in range(0, len(docs), batch_size):
        tokens = torch.tensor([[eos] + d for d in docs[i : i + batch_size]], dtype=torch.long)  # (B, T+1)
        kwargs: dict[str, Any] = {}
        if doc_mask:
            from ..model.documents import doc_ids_from_eos

            kwargs = {"doc_ids": doc_ids_from_eos(tokens, eos)[:, :-1], "restart_positions": restart}
        rows.append(window_nll(model, tokens, **kwargs).numpy())
        if bar is not None:
            bar.update(int(tokens[:, 1:].numel()))
    return np.concatenate(rows)


def curves(nll: np.ndarray, train_len: int) -> dict:
    """Per-position mean NLL, cumulative average NLL and per-bucket NLL (± standard error over documents) of a (D, T)
    NLL matrix; a bucket that reaches past `train_len` is marked as extrapolation."""
    import numpy as np

    D, T = nll.shape
    by_pos = nll.mean(0)  # (T,)
    cumulative = np.cumsum(by_pos) / np.arange(1, T + 1)
    rows = []
    for lo, hi in buckets(T):
        per_doc = nll[:, lo - 1 : hi].mean(1)  # (D,) each document's mean over the bucket
        se = float(per_doc.std(ddof=1) / math.sqrt(D)) if D > 1 else float("nan")
        rows.append(
            {
                "from": lo,
                "to": hi,
                "nll": float(per_doc.mean()),
                "se": se,
                "cumulative": float(cumulative[hi - 1]),
                "extrapolation": hi > train_len,
            }  # fmt: skip
        )
    return {
        "documents": D,
        "loss": float(by_pos.mean()),
        "nll_by_position": by_pos.tolist(),
        "cumulative_nll": cumulative.tolist(),
        "buckets": rows,
    }


def table(res: dict) -> str:
    from .report import markdown

    rows = [
        [name, f"{b['from']}-{b['to']}", b["nll"], b["se"], b["cumulative"], "extrapolation" * b["extrapolation"]]
        for name, s in res["sources"].items()
        for b in s["buckets"]
    ]
    return markdown(["source", "positions", "NLL", "± se", "cumulative avg NLL", ""], rows)


def figure(res: dict, path) -> None:
    """Cumulative average NLL and per-bucket NLL against position (log scale), one line per source; a dashed line at
    the training length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cum, per) = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, s in res["sources"].items():
        T = len(s["cumulative_nll"])
        cum.plot(range(1, T + 1), s["cumulative_nll"], label=name)
        per.errorbar([math.sqrt(b["from"] * b["to"]) for b in s["buckets"]], [b["nll"] for b in s["buckets"]],
                     yerr=[b["se"] for b in s["buckets"]], marker="o", label=name)  # fmt: skip
    for ax, title in ((cum, "cumulative average NLL"), (per, "NLL per position bucket")):
        if res["seq_len"] > res["train_seq_len"]:
            ax.axvline(res["train_seq_len"], color="gray", ls="--", label="training length")
        ax.set(xscale="log", xlabel="position", ylabel="NLL (nats)", title=title)
    per.legend(fontsize=8)
    fig.suptitle(f"{res['model']} ({res['arch']}) step {res['step']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_by_position(c: PplConfig, the_seq_len) -> dict:
    """`eval ppl by_position=true`: reads the long documents before the weights are gathered (their lengths are the
    argument check), scores them and writes ppl_by_position.{json,md,png} beside ppl.json."""
    from ..data.progress import progress

    found: dict[str, tuple] = {}

    def check(run, mcfg) -> None:
        if c.batch_size < 1:
            raise EvalError(f"batch_size={c.batch_size}: must be >= 1")
        if c.max_docs is not None and c.max_docs < 1:
            raise EvalError(f"max_docs={c.max_docs}: must be >= 1")
        seq_len = the_seq_len(run, mcfg)
        if seq_len < 1:
            raise EvalError(f"seq_len={seq_len}: must be >= 1")
        cfg = data_config(run.config(), c.data)
        if cfg.holds_out and not c.whole:
            raise EvalError(
                f"by_position=true: scores whole documents, and this data config holds out windows "
                f"(data.val_fraction={cfg.val_fraction}); pass data=<files or data config> or whole=true"
            )
        from ..data.loader import resolve_sources

        tok = run.tokenizer()
        for src in resolve_sources(cfg, val=True):
            docs, skipped, longest = long_docs(tok, src, seq_len, c.max_docs)
            if not docs:
                raise EvalError(
                    f"seq_len={seq_len}: longer than every document of source {src.name!r} "
                    f"({skipped} documents, the longest {longest} tokens); pass a shorter seq_len"
                )
            found[src.name] = (docs, skipped)

    run, mcfg, model, tok = load_run(c.run, c.step, check)
    seq_len = the_seq_len(run, mcfg)
    train_data = (run.config() or {}).get("data") or {}
    train_len = train_data.get("seq_len") or mcfg.max_seq_len
    if seq_len > mcfg.max_seq_len:  # RoPE as trained, computed for any position: lift the model's length guard only
        model.cfg = dataclasses.replace(model.cfg, max_seq_len=seq_len)
    doc_mask = train_data.get("doc_mask", False) if c.doc_mask is None else c.doc_mask
    restart = doc_mask and train_data.get("restart_positions", False)
    res: dict = {
        "run": str(run.dir),
        "step": run.checkpoint(c.step).step,
        "arch": mcfg.arch,
        "model": mcfg.name,
        "seq_len": seq_len,
        "train_seq_len": train_len,
        "max_seq_len": mcfg.max_seq_len,
        "extrapolation": seq_len > train_len,
        "doc_mask": doc_mask,
        "sources": {},
    }
    if seq_len > train_len:
        say(f"seq_len={seq_len} > the training length {train_len}: positions past {train_len} are extrapolation")
    for name, (docs, skipped) in found.items():
        say(f"scoring {name}: {len(docs)} documents of >= {seq_len} tokens ({skipped} shorter ones skipped)")
        t0 = time.perf_counter()
        with progress(len(docs) * seq_len, f"ppl by position {name}") as bar:
            nll = score_docs(model, docs, tok.eos_id, c.batch_size, doc_mask, restart, bar)
        s = {**curves(nll, train_len), "skipped_short": skipped}
        s["tokens_per_s"] = round(nll.size / (time.perf_counter() - t0))
        res["sources"][name] = s
    folder = out_dir(c.out, run.dir)
    write_report(folder, STEM, res, table(res))
    figure(res, folder / f"{STEM}.png")
    say(f"wrote {folder}/{STEM}.{{json,md,png}}")
    return res
