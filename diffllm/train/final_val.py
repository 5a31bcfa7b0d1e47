"""The final validation: the whole held-out set (trainer.val_tokens per source; null: all of it), scored as
`diffllm eval ppl` scores the finished run (eval.ppl.run_score_sets' windows, eval.ppl.summed_nats' sums), split over
ranks as in-loop validation is. Its pooled loss (summed nats / counted tokens over every held-out source) is
summary.json's final_val_loss; per source it equals `eval ppl`'s number."""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..eval.ppl import run_score_sets, summed_nats
from .dist import all_reduce_sum
from .eval_hook import _Forward
from .hooks import View


class FinalValidation:
    """Built at setup (its windows read on the CPU, so a set that cannot be built fails before training); `evaluate`
    once the run reaches its budget. Every rank runs the same number of forwards (ZeRO-3), padding its share with a
    batch whose sums are dropped."""

    def __init__(self, run_config: dict, tok, seq_len: int, batch_size: int, max_tokens: Optional[int]):
        self.sets, _ = run_score_sets(run_config, tok, seq_len, batch_size, max_tokens)

    @torch.no_grad()
    def evaluate(self, view: View) -> dict:
        """{loss, tokens, sources: {name: {loss, tokens}}, scored: [what each source's set is]}."""
        engine, r, ws = view.model(), view.rank, view.world_size
        forward = _Forward(view)
        engine.eval()
        sums = []
        for s in self.sets:
            mine = s.batches[r::ws]
            nats, count = 0.0, 0
            for i in range(math.ceil(len(s.batches) / ws)):
                batch = (mine[i] if i < len(mine) else s.batches[0]).to(view.device)
                n, c = summed_nats(forward, [batch])
                if i < len(mine):
                    nats, count = nats + n, count + c
            sums += [nats, float(count)]
        engine.train()
        sums = all_reduce_sum(sums)
        sources = {
            s.name: {"loss": sums[2 * k] / sums[2 * k + 1], "tokens": int(sums[2 * k + 1])}
            for k, s in enumerate(self.sets)
        }
        tokens = sum(sums[1::2])
        return {
            "loss": sum(sums[0::2]) / tokens,
            "tokens": int(tokens),
            "sources": sources,
            "scored": [s.what for s in self.sets],
        }
