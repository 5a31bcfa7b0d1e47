"""In-loop validation: the held-out loss at the start, every trainer.val_every steps and at the end (`Validation`,
which the loop calls), and its metrics.jsonl record (`val_losses_record`). The final validation over the whole
held-out set is final_val.py's."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .dist import all_reduce_sum
from .loss import lm_loss
from .metrics import finite_or_none

if TYPE_CHECKING:
    from ..data import Batch
    from .hooks import View

MAIN_VAL = "val"  # the validation set named by data.val; its loss is `val_loss` (others: `val_loss/<name>`)


def val_losses_record(step: int, tokens: int, losses: dict[str, float]) -> dict:
    """The metrics.jsonl record of one validation: val_loss for the main set, val_loss/<name> for the others."""
    rec = {"step": step, "tokens": tokens}
    for name, loss in losses.items():
        rec["val_loss" if name == MAIN_VAL else f"val_loss/{name}"] = finite_or_none(loss)
    return rec


class Validation:
    """Held-out loss at the start (step 0 is recorded), every `every` steps, and at the end: the loop calls it. `sets`:
    named lists of Batches; the main one is "val". The loss is per counted target token (with data.loss_on=marked:
    the marked ones)."""

    def __init__(self, sets: dict[str, list[Batch]], every: int):
        self.sets, self.every = sets, every

    def due(self, view: View) -> bool:
        step = view.state.step
        return bool(self.every) and step % self.every == 0 and step < view.budget.steps and not view.failing()

    def validate(self, view: View) -> dict[str, float]:
        """Every set's loss, said; the caller records it."""
        losses = {name: self.evaluate(view, batches) for name, batches in self.sets.items()}
        main = losses.get(MAIN_VAL, next(iter(losses.values())))
        view.state.last_val_loss = main
        view.say(
            f"step {view.state.step}: val_loss {main:.4f}"
            + "".join(f", {name} {v:.4f}" for name, v in losses.items() if name != MAIN_VAL)
        )
        return losses

    @torch.no_grad()
    def evaluate(self, view: View, batches: list[Batch]) -> float:
        """Mean token loss over `batches`, split over ranks. Every rank runs the same number of forwards (ZeRO-3
        gathers parameters collectively), padding with a zero-weight batch where its share is short."""
        engine, r, ws = view.model(), view.rank, view.world_size
        engine.eval()
        mine = batches[r::ws]
        total, count = 0.0, 0
        for i in range(math.ceil(len(batches) / ws)):
            view.beat("validation")
            batch = (mine[i] if i < len(mine) else batches[0]).to(view.device)
            loss = lm_loss(engine, batch, reduction="sum")
            if i < len(mine):
                total, count = total + loss.item(), count + batch.loss_tokens()
        engine.train()
        total, count = all_reduce_sum([total, float(count)])
        return total / count if count else float("nan")
