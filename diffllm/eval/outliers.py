"""`diffllm eval outliers`: activation outliers after the paper's Table 5, and the loss after quantising attention
logits.

Over a token sample (held-out windows): the top-1/2/3/10/100 and the median of |q k^T / sqrt d| (every layer, head
and causal entry; Diff: both maps pooled, as the paper's authors measured) and of |h| for each layer's output hidden
states (all layers pooled, and top-1 per layer). Medians come from a uniform random sample of up to 2^16 values per
layer and batch.
Then the loss with each attention map's logits absmax-quantised to 16/8/6/4 bits: per map (one head of one
sequence), scale = max |logit| over its causal entries / (2^(bits-1) - 1), logits rounded to that grid; and through
the same quantised forward the accuracy on the shipped plays_cloze task (eval/cloze.py; the paper's HellaSwag
accuracy under low-bit logits, at our scale: text of the training distribution, whose accuracy can rise with language
modelling alone, where the synthetic ICL task sits at chance without ICL-like training data; docs/eval.md).
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from ..config import run_key_values
from ..model.documents import causal_mask
from . import cloze
from .common import EvalError, load_run, out_dir, say, write_json
from .config import OutliersConfig
from .maps import capture, scores_transformed
from .ppl import eval_sources, perplexity

TOPS = (1, 2, 3, 10, 100)
CLOZE_BATCH = 16  # plays_cloze sequences (one length each batch) per forward
SAMPLE = 1 << 20


class Extremes:
    """Running top-100 and a uniform random sample (for the median) of a stream of non-negative values."""

    def __init__(self, seed: int = 0):
        self.top = torch.zeros(0)
        self.sample: list = []
        self.seen = 0
        self.gen = torch.Generator().manual_seed(seed)

    def add(self, values: torch.Tensor) -> None:
        v = values.detach().float().flatten()
        both = torch.cat([self.top, v.topk(min(max(TOPS), v.numel())).values])
        self.top = both.topk(min(max(TOPS), both.numel())).values
        self.seen += v.numel()
        keep = SAMPLE // 16  # per call: every value of a small tensor, a uniform subset of a large one
        self.sample.append(v if v.numel() <= keep else v[torch.randperm(v.numel(), generator=self.gen)[:keep]])

    def summary(self) -> dict:
        out = {f"top{k}": float(self.top[k - 1]) for k in TOPS if self.top.numel() >= k}
        out["median"] = float(torch.cat(self.sample).median())
        out["values"] = self.seen
        return out


def absmax_quantiser(bits: int):
    """Round each map's logits (B, H, T, T) to a symmetric grid of 2^(bits-1)-1 steps of its causal absmax."""
    levels = 2 ** (bits - 1) - 1

    def quantise(scores: torch.Tensor) -> torch.Tensor:
        mask = causal_mask(scores.shape[-1], scores.shape[-1], scores.device)
        absmax = scores.abs().masked_fill(~mask, 0).amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
        scale = absmax / levels
        return torch.round(scores / scale) * scale

    return quantise


@torch.inference_mode()
def outlier_stats(model: torch.nn.Module, batches: List[torch.Tensor]) -> dict:
    """{"attention_logits": {...}, "hidden_states": {...}, "hidden_top1_per_layer": [...]} over `batches`
    (token windows (B, T+1)); a plain function for in-loop use."""
    logit_x, hidden_x = Extremes(0), Extremes(1)
    per_layer = [0.0] * len(model.layers)
    for tokens in batches:
        with capture(model) as got:
            model(tokens[:, :-1])
        T = tokens.shape[1] - 1
        mask = causal_mask(T, T)
        for layer, (x, cos, sin) in zip(model.layers, got["inputs"]):
            scores, _ = layer.attn.scores(x, cos, sin)  # (B, Hq, T, T): every softmax map (Diff: both)
            logit_x.add(scores.abs()[..., mask])
        for i, h in enumerate(got["hidden"]):
            hidden_x.add(h.abs())
            per_layer[i] = max(per_layer[i], float(h.abs().max()))
    return {
        "attention_logits": logit_x.summary(),
        "hidden_states": hidden_x.summary(),
        "hidden_top1_per_layer": per_layer,
    }


def at_each_width(model: torch.nn.Module, bits: List[int], measure, what: str = "") -> dict:
    """{"fp32": measure(), "16": measure() with every attention map's logits quantised to 16 bits, ...}; `what`: a
    line on stderr before each width (the command's progress)."""
    out = {}
    for i, b in enumerate([None, *bits]):
        name = "fp32" if b is None else str(b)
        if what:
            say(f"{what} at {'fp32' if b is None else f'{b}-bit'} attention logits ({i + 1}/{len(bits) + 1})")
        if b is None:
            out[name] = measure()
            continue
        with scores_transformed(model, absmax_quantiser(b)):
            out[name] = measure()
    return out


def quantised_losses(model: torch.nn.Module, batches: List[torch.Tensor], bits: List[int], what: str = "") -> dict:
    """{"fp32": loss, "16": loss, ...}: the mean token loss with every attention map's logits quantised."""
    from ..data.batch import Batch

    full = [Batch(b) for b in batches]  # every target counts
    return at_each_width(model, bits, lambda: perplexity(model, full)["loss"], what)


def quantised_accuracy(
    model: torch.nn.Module, tok, n_items: int, bits: List[int], batch_size: int, what: str = ""
) -> dict:
    """{"fp32": accuracy, "16": accuracy, ...}: plays_cloze accuracy (eval/cloze.py) on its first n_items items with
    every attention map's logits quantised."""
    task = cloze.items(n_items)
    return at_each_width(model, bits, lambda: cloze.accuracy(model, tok, task, batch_size), what)


def sample_batches(run_cfg: Optional[dict], data: Any, tok, n_tokens: int, seq_len: int, batch_size: int) -> list:
    """Full windows (B, seq_len+1) of held-out text, about n_tokens tokens in all."""
    from .ppl import score_sets

    first = score_sets(run_cfg, data, tok, seq_len, batch_size, n_tokens + seq_len)[0]  # held-out windows, as ppl's
    batches = [b.tokens for b in first.batches if b.tokens.shape[1] == seq_len + 1]
    if not batches:
        raise EvalError(f"data: fewer than {seq_len + 1} tokens of held-out text")
    kept, count = [], 0
    for b in batches:
        if count >= n_tokens:
            break
        kept.append(b)
        count += b[:, 1:].numel()
    return kept


def run_outliers(c: OutliersConfig) -> dict:
    def the_seq_len(run, mcfg) -> int:
        return c.seq_len or ((run.config() or {}).get("data") or {}).get("seq_len") or mcfg.max_seq_len

    def check(run, mcfg) -> None:  # the arguments, before the weights are gathered
        if any(b < 2 for b in c.bits):
            raise EvalError(f"bits={c.bits}: each must be >= 2")
        if c.tokens < 1 or c.batch_size < 1:
            raise EvalError(f"tokens={c.tokens}, batch_size={c.batch_size}: each must be >= 1")
        if c.cloze_items < 0:
            raise EvalError(f"cloze_items={c.cloze_items}: want >= 0 (0: no accuracy)")
        if the_seq_len(run, mcfg) > mcfg.max_seq_len:
            raise EvalError(f"seq_len={the_seq_len(run, mcfg)}: longer than the model's context ({mcfg.max_seq_len})")
        eval_sources(run.config(), c.data)  # a data config that does not exist, a glob that matches nothing

    run, mcfg, model, tok = load_run(c.run, c.step, check)
    run_cfg = run.config()
    seq_len = the_seq_len(run, mcfg)
    batches = sample_batches(run_cfg, c.data, tok, c.tokens, seq_len, c.batch_size)
    n = sum(b[:, 1:].numel() for b in batches)
    say(f"{run.dir}: top-k attention logits and hidden states over {n:,} held-out tokens ({seq_len}-token windows)")
    res = outlier_stats(model, batches)
    res["quantised_loss"] = quantised_losses(model, batches, c.bits, f"loss over {n:,} tokens")
    if c.cloze_items:
        what = f"plays_cloze accuracy ({len(cloze.items(c.cloze_items))} items)"
        res["quantised_accuracy"] = quantised_accuracy(model, tok, c.cloze_items, c.bits, CLOZE_BATCH, what)
        res["accuracy_task"] = {"task": "plays_cloze", "items": len(cloze.items(c.cloze_items)), "chance": 0.25}
    res.update(
        run=str(run.dir),
        step=run.checkpoint(c.step).step,
        arch=mcfg.arch,
        model=mcfg.name,
        tokens=sum(b[:, 1:].numel() for b in batches),
        seq_len=seq_len,
    )
    from .report import markdown

    rows = [
        [name] + [res[key].get(f"top{k}", float("nan")) for k in TOPS] + [res[key]["median"]]
        for name, key in (("attention logits", "attention_logits"), ("hidden states", "hidden_states"))
    ]
    table = markdown(["activation"] + [f"top-{k}" for k in TOPS] + ["median"], rows)
    q = res["quantised_loss"]
    quantised = [["loss"] + [f"{v:.4f}" for v in q.values()]]
    if "quantised_accuracy" in res:
        name = f"plays_cloze accuracy ({res['accuracy_task']['items']} items)"
        quantised.append([name] + [f"{v:.4f}" for v in res["quantised_accuracy"].values()])
    table += "\n\n" + markdown(["logits"] + [k if k == "fp32" else f"{k}-bit" for k in q], quantised)
    folder = out_dir(c.out, run.dir)
    write_json(folder / "outliers.json", res)
    (folder / "outliers.md").write_text(table + "\n")
    print(table)
    say(f"{res['tokens']:,} tokens; wrote {folder}/outliers.{{json,md}}")
    return res


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("eval outliers", OutliersConfig, run_outliers, argv)


if __name__ == "__main__":
    main()
