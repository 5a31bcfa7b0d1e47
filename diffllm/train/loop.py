"""The training loop: steps to the token budget, validation, checkpoints, preemption and non-finite steps."""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from ..config import build
from ..model import ModelConfig
from ..model.accounting import model_stats
from .checkpoint import CheckpointManager, Resume, find_resume, rng_state, set_rng_state
from .config import LoggingConfig, OptimConfig, TrainerConfig, plan_budget
from .dist import all_gather_object, all_reduce_sum, barrier, init_distributed, rank, set_env_defaults, world_size
from .engine import build_engine, deepspeed_config, resolve_precision
from .metrics import MetricsLog, device_name, finite_or_none, mfu, peak_tflops, progress_line
from .schedule import lr_at
from .signals import StopFlag
from .state import TrainState, move_aside, write_summary
from .tracking import new_run_id, open_wandb

EXIT_FINISHED = 0
EXIT_PREEMPTED = 3  # a stop signal arrived; the step finished and a checkpoint was saved: relaunch to continue
EXIT_NONFINITE = 4  # trainer.max_nonfinite_in_a_row consecutive steps had a non-finite loss or gradient


def say(msg: str, error: bool = False) -> None:
    if rank() == 0:
        print(f"[diffllm.train] {msg}", file=sys.stderr if error else sys.stdout, flush=True)


class Trainer:
    def __init__(self, cfg: DictConfig):
        from ..data import DataConfig

        self.config = OmegaConf.to_container(cfg, resolve=True)
        self.trainer = build(TrainerConfig, cfg.trainer, "trainer")
        self.optim = build(OptimConfig, cfg.optim, "optim")
        self.logging = build(LoggingConfig, cfg.logging, "logging")
        self.model_cfg = build(ModelConfig, cfg.model, "model")
        self.data_cfg = build(DataConfig, cfg.data, "data")
        for c in (self.trainer, self.optim, self.logging):
            c.validate()
        set_env_defaults()  # a plain single process is a world of one; checked here, before any heavy setup
        self.budget = plan_budget(self.trainer, self.data_cfg.seq_len, int(os.environ["WORLD_SIZE"]))
        self.seed = int(cfg.seed)
        self.run_dir = Path(cfg.run_dir)
        self.state = TrainState()
        self.stop = StopFlag()
        self.saved_step = -1

    # ----- setup -------------------------------------------------------------------------------------------------
    def setup(self) -> None:
        from ..data import build_train_loader, build_val_batches, ensure_tokenizer

        self.t_launch = time.monotonic()
        self.device = init_distributed(self.trainer.dist_timeout_minutes)
        self.rank, self.ws = rank(), world_size()
        if self.rank == 0:  # a tokenizer trained once, by one process
            tok = ensure_tokenizer(self.data_cfg)
        barrier()
        if self.rank != 0:
            tok = ensure_tokenizer(self.data_cfg)
        self.model_cfg.vocab_size = tok.vocab_size
        self.stats = model_stats(self.model_cfg, self.data_cfg.seq_len)
        self.precision = resolve_precision(self.trainer)
        self.ckpt = CheckpointManager(self.run_dir, self.trainer.keep_last)
        resume = self.prepare_run_dir()
        if resume is not None:
            self.check_model(resume)

        universal = resume is not None and self.needs_universal(resume)
        self.ds_config = deepspeed_config(self.trainer, self.optim, self.budget, self.precision, universal)
        self.engine, self.optimizer = build_engine(self.model_cfg, self.trainer, self.optim, self.ds_config, self.seed)
        self.loader = build_train_loader(self.data_cfg, tok, self.rank, self.ws, self.budget.micro_batch_size)
        self.val = build_val_batches(self.data_cfg, tok, self.trainer.val_batch_size or self.budget.micro_batch_size,
                                     self.trainer.val_batches)
        client = self.load(resume, universal) if resume else None
        if client is None:
            self.state.wandb_id = all_gather_object(new_run_id())[0]
        self.metrics = MetricsLog(self.run_dir)
        if self.rank == 0:
            dropped = self.metrics.truncate_after(self.state.step)
            if dropped:
                say(f"metrics.jsonl: dropped {dropped} records after step {self.state.step} (they are redone now)")
            self.metrics.wandb = open_wandb(self.logging, self.run_dir, self.state.wandb_id, self.config)
        self.peak = self.logging.peak_tflops or peak_tflops(device_name())
        self.last_save_t = time.monotonic()

    def prepare_run_dir(self) -> Optional[Resume]:
        """Rank 0 tidies run_dir (fresh start: old files moved aside; interrupted saves removed); then every rank
        finds the checkpoint to resume from: trainer.resume = auto | none | <path>."""
        mode = self.trainer.resume
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.ckpt.remove_partial()
            if mode == "none":
                move_aside(self.run_dir, "trainer.resume=none")
            elif mode == "auto" and self.ckpt.latest() is None:
                move_aside(self.run_dir, "no checkpoint to resume from")
        barrier()
        if mode == "none":
            return None
        if mode == "auto":
            return self.ckpt.latest()
        if not Path(mode).exists():
            raise ValueError(f"trainer.resume={mode}: no such checkpoint (use auto, none or a checkpoint path)")
        found = find_resume(Path(mode))
        if found is None:
            raise ValueError(f"trainer.resume={mode}: no `latest` file or meta.json there")
        return found

    def check_model(self, res: Resume) -> None:
        """A checkpoint of another architecture is refused up front, naming the first differing key."""
        saved, ours = res.meta.get("model", {}), asdict(self.model_cfg)
        for key in sorted(set(saved) | set(ours)):
            if key not in ("name", "attn_backend", "max_seq_len") and saved.get(key) != ours.get(key):
                raise ValueError(f"model.{key}: the checkpoint {res.dir / res.tag} has {saved.get(key)!r}, this run "
                                 f"{ours.get(key)!r}; use another run_dir, or trainer.resume=none to start afresh")

    def needs_universal(self, res: Resume) -> bool:
        """A different world size or ZeRO stage loads through DeepSpeed's universal checkpoint (a ZeRO-0 checkpoint
        has no ZeRO shards to convert: it resumes only as it was saved)."""
        saved = (res.meta["world_size"], res.meta["zero_stage"])
        if saved == (self.ws, self.trainer.zero_stage):
            return False
        if saved[1] == 0:
            raise ValueError(f"trainer.zero_stage: {res.dir / res.tag} was saved with ZeRO-0 on {saved[0]} rank(s), "
                             f"which cannot be resharded; resume it with trainer.zero_stage=0 on {saved[0]} rank(s)")
        return True

    def load(self, res: Resume, universal: bool) -> dict:
        tag = CheckpointManager.to_universal(res) if universal else res.tag
        path, client = self.engine.load_checkpoint(str(res.dir), tag=tag, load_lr_scheduler_states=False)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load {res.dir / tag}")
        saved = client["diffllm"]
        self.state = TrainState.from_dict(saved["train_state"])
        self.warn_changes(saved["config"])
        self.loader.load_state_dict(saved["data"])  # raises, naming the problem, if it cannot resume exactly
        set_rng_state(saved["rng"], self.rank)
        how = (f"a universal checkpoint (world size {saved['world_size']} -> {self.ws}, ZeRO-{res.meta['zero_stage']} -> "
               f"{self.trainer.zero_stage})" if universal else "checkpoint")
        say(f"resumed from {how} {res.dir / tag}: step {self.state.step}, {self.state.tokens:,} tokens")
        return client

    def warn_changes(self, saved: dict) -> None:
        for group, key in (("trainer", "tokens"), ("trainer", "global_batch_tokens"), ("optim", "lr"),
                           ("optim", "schedule"), ("optim", "warmup_steps"), ("data", "name")):
            old, new = saved.get(group, {}).get(key), self.config[group].get(key)
            if old != new:
                say(f"note: {group}.{key} changed since the checkpoint ({old} -> {new}); the run continues with {new}")

    # ----- one step ----------------------------------------------------------------------------------------------
    def train_step(self) -> tuple[dict, bool]:
        """One optimizer step over grad_accum micro-batches. Returns (record, whether any rank asked to stop)."""
        t0 = time.perf_counter()
        step, accum = self.state.step, self.budget.grad_accum
        lr = lr_at(step, self.budget.steps, self.optim)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(accum):
            batch = next(self.loader).to(self.device)  # (B, T+1)
            logits = self.engine(batch[:, :-1])  # (B, T, V)
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            if step + 1 in self.trainer.inject_nan_at_steps and self.rank == 0:
                loss = loss * float("nan")  # fault injection (trainer.inject_nan_at_steps): a real NaN, rank 0 only
            self.engine.backward(loss)  # DeepSpeed divides by grad_accum
            loss_sum += loss.detach()
            if micro == accum - 1:  # the update happens in the engine.step() below: agree first
                mean_loss, stop, save_due = self.agree(loss_sum.item())
                plain_norm = self.plain_grad_norm()
                self.optimizer.force_skip = not math.isfinite(mean_loss)
                self.optimizer.skipped, ds_skipped = False, self.engine.skipped_steps
            self.engine.step()
        skipped = self.optimizer.skipped or self.engine.skipped_steps > ds_skipped  # ours, or DeepSpeed's own check
        self.optimizer.force_skip = False
        s = self.state
        s.step, s.tokens = s.step + 1, s.tokens + self.budget.global_batch_tokens
        s.skipped_steps += skipped
        s.nonfinite_in_a_row = s.nonfinite_in_a_row + 1 if skipped else 0
        s.last_loss = mean_loss
        norm = self.engine.get_global_grad_norm()
        norm = plain_norm if norm is None else norm
        rec = {"step": s.step, "tokens": s.tokens, "loss": finite_or_none(mean_loss), "lr": lr,
               "grad_norm": None if norm is None or skipped else finite_or_none(float(norm)),
               "step_time_s": time.perf_counter() - t0, "skipped": skipped, "save_due": save_due}
        return rec, stop

    def plain_grad_norm(self) -> Optional[float]:
        """Without ZeRO, DeepSpeed clips fp32 gradients but does not keep their norm: take it here, before clipping
        (the gradients are already averaged over ranks). ZeRO stages report their own."""
        if self.trainer.zero_stage != 0:
            return None
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads)) if grads else None

    def agree(self, local_loss_sum: float) -> tuple[float, bool, bool]:
        """One collective per step: (mean loss over ranks and micro-batches, a stop signal reached some rank,
        save_every_minutes has passed on some rank)."""
        minutes = self.trainer.save_every_minutes
        due = bool(minutes) and time.monotonic() - self.last_save_t >= 60 * minutes
        total, stop, save_due = all_reduce_sum([local_loss_sum, float(self.stop.received is not None), float(due)])
        return total / (self.budget.grad_accum * self.ws), stop > 0, save_due > 0

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean token loss over the held-out batches, split over ranks. Every rank runs the same number of forwards
        (ZeRO-3 gathers parameters collectively), padding with a zero-weight batch where its share is short."""
        self.engine.eval()
        mine = self.val[self.rank::self.ws]
        total, count = 0.0, 0
        for i in range(math.ceil(len(self.val) / self.ws)):
            batch = (mine[i] if i < len(mine) else self.val[0]).to(self.device)
            logits = self.engine(batch[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
            if i < len(mine):
                total, count = total + loss.item(), count + batch[:, 1:].numel()
        self.engine.train()
        total, count = all_reduce_sum([total, float(count)])
        return total / count

    def validate(self, write: bool = True) -> float:
        val = self.evaluate()
        self.state.last_val_loss = val
        say(f"step {self.state.step}: val_loss {val:.4f}")
        if write and self.rank == 0:
            self.metrics.write({"step": self.state.step, "tokens": self.state.tokens, "val_loss": finite_or_none(val)})
        return val

    # ----- checkpoints -------------------------------------------------------------------------------------------
    def client_state(self) -> dict:
        return {"diffllm": {
            "train_state": self.state.to_dict(),
            "data": all_gather_object(self.loader.state_dict()),  # every rank's view; the loader restores from all
            "rng": all_gather_object(rng_state()),
            "config": self.config,
            "world_size": self.ws,
            "schedule": {"name": self.optim.schedule, "step": self.state.step, "total_steps": self.budget.steps},
        }}

    def save(self) -> None:
        if self.saved_step == self.state.step:
            return
        t0 = time.monotonic()
        self.state.elapsed_s = self.elapsed()
        meta = {"step": self.state.step, "tokens": self.state.tokens, "world_size": self.ws,
                "zero_stage": self.trainer.zero_stage, "saved_at": time.time(), "model": asdict(self.model_cfg)}
        tag = self.ckpt.save(self.engine, self.state.step, self.client_state(), meta)
        self.saved_step, self.last_save_t = self.state.step, time.monotonic()
        say(f"checkpoint: saved {self.ckpt.dir / tag} ({time.monotonic() - t0:.1f} s)")

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.t_launch

    # ----- the run -----------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.setup()
        self.elapsed_before = self.state.elapsed_s
        self.saved_step = self.state.step if self.state.step else -1
        b, s = self.budget, self.state
        say(f"{self.model_cfg.name} ({self.model_cfg.arch}): {self.stats.total_params:,} params "
            f"({self.stats.nonembedding_params:,} non-embedding), {self.stats.flops_per_token:.3g} FLOPs/token")
        say(f"budget {b.tokens:,} tokens = {b.steps} steps x {b.global_batch_tokens:,} tokens "
            f"(micro-batch {b.micro_batch_size} x seq {b.seq_len} x grad-accum {b.grad_accum} x {self.ws} ranks); "
            f"ZeRO-{self.trainer.zero_stage}, {self.precision}, {device_name()}, run_dir {self.run_dir}")
        self.stop.install()
        try:
            return self.loop()
        finally:
            self.stop.restore()
            self.loader.close()  # stops its DataLoader worker processes
            if self.metrics.wandb is not None:
                self.metrics.wandb.finish()

    def loop(self) -> int:
        b, s, t = self.budget, self.state, self.trainer
        if s.step < b.steps and self.rank == 0:
            (self.run_dir / "summary.json").unlink(missing_ok=True)  # stale until this run finishes
        self.validate(write=s.step == 0)
        window_t, window_steps = 0.0, 0
        while s.step < b.steps:
            rec, stop = self.train_step()
            window_t, window_steps = window_t + rec.pop("step_time_s"), window_steps + 1
            save_due = rec.pop("save_due") or (t.save_every_steps and s.step % t.save_every_steps == 0)
            if s.step % t.log_every == 0 or s.step == b.steps or rec["skipped"]:
                self.log(rec, window_t, window_steps)
                window_t, window_steps = 0.0, 0
            if s.nonfinite_in_a_row >= t.max_nonfinite_in_a_row:
                last = self.ckpt.latest()
                say(f"error: {s.nonfinite_in_a_row} steps in a row had a non-finite loss or gradient (step {s.step}); "
                    f"stopping (trainer.max_nonfinite_in_a_row={t.max_nonfinite_in_a_row}); the last checkpoint: "
                    f"{last.dir / last.tag if last else 'none'} (exit code {EXIT_NONFINITE})", error=True)
                return EXIT_NONFINITE
            if t.val_every and s.step % t.val_every == 0 and s.step < b.steps:
                self.validate()
            if stop and s.step < b.steps:
                self.save()
                say(f"stopped by {self.stop.received or 'a signal on another rank'} at step {s.step}; "
                    f"relaunch the same command to continue (exit code {EXIT_PREEMPTED})")
                return EXIT_PREEMPTED
            if save_due and s.step < b.steps:
                self.save()
        if window_steps == 0 and s.step == b.steps and self.saved_step == s.step:
            say(f"the run is already at its budget ({b.tokens:,} tokens): raise trainer.tokens to train on, or "
                f"trainer.resume=none to start afresh")
        else:
            self.validate()
        self.save()
        self.finish()
        return EXIT_FINISHED

    def log(self, rec: dict, window_t: float, window_steps: int) -> None:
        tokens_per_s = window_steps * self.budget.global_batch_tokens / max(window_t, 1e-9)
        rec.update(tokens_per_s=tokens_per_s, mfu=mfu(tokens_per_s / self.ws, self.stats.flops_per_token, self.peak),
                   skipped_steps=self.state.skipped_steps)
        if rec["loss"] is None:
            rec["nonfinite"] = True
        if self.rank == 0:
            self.metrics.write(rec)
            eta = (self.budget.steps - self.state.step) * window_t / max(window_steps, 1)
            print(progress_line(rec, self.budget.steps, self.budget.tokens, eta), flush=True)

    def finish(self) -> None:
        """summary.json. wall_time_s adds up each launch's time until its last checkpoint: steps that a kill threw away
        (and then were redone) are not counted twice, nor is relaunching a finished run."""
        s, st = self.state, self.stats
        summary = {
            "model": self.model_cfg.name, "arch": self.model_cfg.arch, "total_params": st.total_params,
            "nonembedding_params": st.nonembedding_params, "tokens": s.tokens, "flops": st.flops_per_token * s.tokens,
            "flops_per_token": st.flops_per_token, "steps": s.step, "seq_len": self.budget.seq_len,
            "global_batch_tokens": self.budget.global_batch_tokens, "final_train_loss": finite_or_none(s.last_loss),
            "final_val_loss": finite_or_none(s.last_val_loss), "wall_time_s": round(s.elapsed_s, 3),
            "world_size": self.ws, "zero_stage": self.trainer.zero_stage, "precision": self.precision,
            "device": device_name(), "skipped_steps": s.skipped_steps, "status": "finished",
            "checkpoint": str(self.ckpt.dir / f"step{s.step}"), "run_dir": str(self.run_dir),
        }
        if self.rank == 0:
            write_summary(self.run_dir, summary)
            say(f"finished: {s.tokens:,} tokens, final train loss {summary['final_train_loss']}, "
                f"val loss {summary['final_val_loss']}, {summary['wall_time_s']:.0f} s -> {self.run_dir / 'summary.json'}")
