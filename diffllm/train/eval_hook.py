"""In-loop evaluation (`trainer.eval`): diffllm/eval's measures every N steps during training, as a hook.

    diffllm train trainer.eval.every=32 trainer.eval.ppl_data=[shakespeare] trainer.eval.needle_n=[1,2]

Each evaluation writes one metrics.jsonl record (and W&B, through the run's one MetricsWriter) with step, tokens and
  eval/ppl/<name>/loss, eval/ppl/<name>/bpb   ppl.perplexity on a data config's held-out sources (<name>: the config,
                                              or <config>/<source> when it holds several)
  eval/needle/n<N>/acc, eval/needle/acc       needle.needle_accuracy (synthetic or text haystack), per N and overall
  eval/recall/n<N>/acc, eval/recall/acc       recall.recall_accuracy (held-out key-value sets), per N and overall
  eval/time_s
and one console line. The windows and prompts are built once (at the start) from the data and a seed of their own, so
each evaluation scores the same tokens and the numbers equal `diffllm eval ppl` / `eval needle` on the checkpoint of
that step. Every rank runs every forward (ZeRO-3 gathers parameters collectively; the ranks get the same numbers);
only rank 0 writes. Nothing here draws from the global RNGs (they are forked around the evaluation all the same) or
touches the training data stream; the model runs in eval mode without gradients and goes back to train mode.
"""

from __future__ import annotations

import time
from typing import Mapping, Optional

import torch

from ..errors import UserError
from ..eval.needle import NeedleTask, haystack_tokens, needle_accuracy, task_prompts
from ..eval.ppl import perplexity, score_sets
from ..eval.recall import RecallTask, recall_accuracy
from ..eval.recall import task_prompts as recall_prompts
from .config import EvalConfig
from .hooks import Hook, View


class _Forward:
    """The engine as the eval functions see a model: `model(ids)` -> logits and `model.cfg`. Each forward goes
    through the DeepSpeed engine (ZeRO-3's parameter gathering) and tells the step watchdog that evaluation is busy.
    `to_cpu`: logits come back on the CPU (needle_accuracy compares them with CPU token tensors)."""

    def __init__(self, view: View, to_cpu: bool = False):
        self.view, self.engine, self.to_cpu = view, view.model(), to_cpu
        self.cfg = self.engine.module.cfg

    def __call__(self, ids: torch.Tensor, **model_kwargs) -> torch.Tensor:
        self.view.beat("in-loop evaluation")
        logits = self.engine(ids.to(self.view.device), **model_kwargs)  # (B, T, V)
        return logits.cpu() if self.to_cpu else logits


class InLoopEval(Hook):
    """Evaluates every `cfg.every` steps and/or at the last step (`cfg.at_end`); see the module docstring."""

    def __init__(self, cfg: EvalConfig, tok, seq_len: int, run_config: dict):
        self.cfg, self.tok, self.seq_len, self.run_config = cfg, tok, seq_len, run_config
        data = (run_config or {}).get("data") or {}  # perplexity with the run's own document masks
        self.doc_mask, self.restart_positions = bool(data.get("doc_mask")), bool(data.get("restart_positions"))
        self.ppl_sets: dict[str, tuple[list, int]] = {}  # name -> ([Batch], bytes)
        self.needle: Optional[NeedleTask] = None
        self.haystack: Optional[list[int]] = None
        self.recall: Optional[RecallTask] = None

    def prepare(self, model_len: int) -> None:
        """Before the run directory is written: the windows and prompts (on the CPU), so that ones that cannot be
        built are refused first; `model_len`: the model's context (model.max_seq_len)."""
        c = self.cfg
        if self.seq_len > model_len:
            raise UserError(f"data.seq_len={self.seq_len}: longer than the model's context ({model_len})")
        for name in c.ppl_data:  # what `diffllm eval ppl data=<name>` scores: held-out windows or whole sources
            sets = score_sets(
                None,
                name,
                self.tok,
                self.seq_len,
                c.batch_size,
                c.ppl_max_tokens,
                doc_mask=self.doc_mask,
                restart_positions=self.restart_positions,
            )
            for s in sets:
                key = name if len(sets) == 1 else f"{name}/{s.name}"
                self.ppl_sets[key] = (s.batches, s.n_bytes)
        if c.needle_n:
            length = c.needle_length or self.seq_len
            if length > model_len:
                raise UserError(f"trainer.eval.needle_length={length}: longer than the model's context ({model_len})")
            self.needle = NeedleTask(
                mode=c.needle_mode,
                n_needles=list(c.needle_n),
                queries=c.needle_queries,
                depths=list(c.needle_depths),
                lengths=[length],
                trials=c.needle_trials,
                seed=c.needle_seed,
                batch_size=c.batch_size,
            )
            if c.needle_mode == "text":  # real text: the run's own held-out documents
                self.haystack = haystack_tokens(self.run_config, None, self.tok, 4 * length)
            try:  # prompts that cannot be built fail now, not after the first `every` steps
                task_prompts(self.needle, self.tok, model_len, self.haystack)
            except ValueError as e:
                raise UserError(f"trainer.eval.needle_length={length}: {str(e).removeprefix('lengths: ')}") from None
        if c.recall_n:  # no bootstrap in the loop: the curve is the accuracies
            self.recall = RecallTask(
                n=list(c.recall_n),
                gaps=list(c.recall_gaps),
                lengths=[c.recall_length],
                trials=c.recall_trials,
                seed=c.recall_seed,
                batch_size=c.batch_size,
                bootstrap=0,
            )
            try:
                recall_prompts(self.recall, self.tok, model_len)
            except ValueError as e:
                raise UserError(
                    f"trainer.eval.recall_length={c.recall_length}: {str(e).removeprefix('lengths: ')}"
                ) from None

    def on_start(self, view: View) -> None:
        self.ppl_sets = {k: ([b.to(view.device) for b in batches], n) for k, (batches, n) in self.ppl_sets.items()}

    def on_step_end(self, view: View, record: Mapping) -> None:
        c, step = self.cfg, view.state.step
        due = (c.every and step % c.every == 0) or (c.at_end and step == view.budget.steps)
        if due and not view.failing():
            self.evaluate(view)

    def evaluate(self, view: View) -> dict:
        """One evaluation of the model as it is now: the metrics record (written by rank 0) and a console line."""
        t0 = time.perf_counter()
        rec: dict = {"step": view.state.step, "tokens": view.state.tokens}
        engine = view.model()
        was_training = engine.training
        devices = [view.device] if view.device.type == "cuda" else []
        engine.eval()
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                for name, (batches, n_bytes) in self.ppl_sets.items():
                    res = perplexity(_Forward(view), batches, n_bytes)
                    rec[f"eval/ppl/{name}/loss"], rec[f"eval/ppl/{name}/bpb"] = res["loss"], res["bits_per_byte"]
                if self.needle is not None:
                    res = needle_accuracy(_Forward(view, to_cpu=True), self.tok, self.needle, self.haystack)
                    rec.update({f"eval/needle/n{n}/acc": acc for n, acc in res["by_n"].items()})
                    rec["eval/needle/acc"] = res["mean"]
                if self.recall is not None:
                    res = recall_accuracy(_Forward(view, to_cpu=True), self.tok, self.recall)
                    rec.update({f"eval/recall/n{n}/acc": acc for n, acc in res["by_n"].items()})
                    rec["eval/recall/acc"] = res["mean"]
        finally:
            engine.train(was_training)
        rec["eval/time_s"] = round(time.perf_counter() - t0, 3)
        view.log(rec)
        view.say(eval_line(rec))
        return rec


def eval_line(rec: dict) -> str:
    """`eval step 32: shakespeare loss 5.1234 bpb 1.8765 | needle n1 0.50 n2 0.25 | recall n2 0.50 | 3.1 s`."""
    parts = [
        f"{k[len('eval/ppl/') : -len('/loss')]} loss {v:.4f} bpb {rec[k[: -len('loss')] + 'bpb']:.4f}"
        for k, v in rec.items()
        if k.startswith("eval/ppl/") and k.endswith("/loss")
    ]
    for task in ("needle", "recall"):
        accs = [f"{k.split('/')[2]} {v:.2f}" for k, v in rec.items() if k.startswith(f"eval/{task}/n")]
        if accs:
            parts.append(f"{task} " + " ".join(accs))
    return f"eval step {rec['step']}: " + " | ".join(parts + [f"{rec['eval/time_s']:.1f} s"])


def eval_hooks(cfg: EvalConfig, tok, seq_len: int, run_config: dict) -> list[Hook]:
    """[InLoopEval] when trainer.eval is on, else [] (its record is written with its step's, before the checkpoint
    of that step: a resume from that checkpoint never loses it)."""
    return [InLoopEval(cfg, tok, seq_len, run_config)] if cfg.on else []
