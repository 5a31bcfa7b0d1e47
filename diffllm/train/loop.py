"""The training loop: steps to the token budget, one agreement per step, preemption and non-finite steps. Validation,
checkpoint saving and metrics are hooks around it (hooks.py); where a run continues from is resume.py's."""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional

import torch

from ..model import ModelConfig
from ..model.accounting import model_stats
from ..runs import TOKENIZER_FILE, Checkpoint, Run
from .checkpoint import CheckpointManager, rng_state, set_rng_state
from .config import TrainConfig, plan_budget
from .dist import all_gather_object, all_reduce_sum, barrier, init_distributed, rank, set_env_defaults, world_size
from .engine import build_engine, deepspeed_config, resolve_precision
from .eval_hook import eval_hooks
from .hooks import MAIN_VAL, Checkpointing, Hook, MetricsLogger, Validation, lm_loss
from .metrics import device_name, finite_or_none, peak_tflops
from .resume import (check_finished_unchanged, check_model, check_same_tokenizer, changed_keys, needs_universal,
                     resume_point, run_tokenizer_file)
from .schedule import lr_at
from .signals import StopFlag
from .state import TrainState
from .tracking import new_run_id
from .watchdog import STALL_EXIT_CODE, Watchdog

EXIT_FINISHED = 0
EXIT_PREEMPTED = 3  # a stop signal arrived; the step finished and a checkpoint was saved: relaunch to continue
EXIT_NONFINITE = 4  # trainer.max_nonfinite_in_a_row consecutive steps had a non-finite loss or gradient
EXIT_STALLED = STALL_EXIT_CODE  # 5: no progress for trainer.stall_timeout_s (the watchdog names the stalled phase)


def say(msg: str, error: bool = False) -> None:
    if rank() == 0:
        print(f"[diffllm.train] {msg}", file=sys.stderr if error else sys.stdout, flush=True)


class Trainer:
    """`Trainer(TrainConfig.from_hydra(cfg), hooks=[...]).run()`. Built-in hooks: MetricsLogger, Validation,
    Checkpointing (in that order); `hooks` are called after them."""

    say = staticmethod(say)

    def __init__(self, cfg: TrainConfig, hooks: Optional[list[Hook]] = None):
        self.cfg = cfg
        self.config = cfg.resolved
        self.trainer, self.optim, self.logging = cfg.trainer, cfg.optim, cfg.logging
        self.model_cfg, self.data_cfg = cfg.model, cfg.data
        set_env_defaults()  # a plain single process is a world of one; checked here, before any heavy setup
        self.budget = plan_budget(self.trainer, self.data_cfg.seq_len, int(os.environ["WORLD_SIZE"]))
        self.seed = cfg.seed
        self.run_dir = Path(cfg.run_dir)
        self.run_obj = Run(self.run_dir)  # a run_dir that is a file: a one-line error, before anything starts
        if self.run_obj.dir != self.run_dir:
            raise ValueError(f"run_dir={self.run_dir}: a checkpoints or step folder, not a run directory; did you mean "
                             f"run_dir={self.run_obj.dir} (or trainer.resume={self.run_dir})?")
        self.state = TrainState()
        self.stop = StopFlag()
        self.watchdog = Watchdog(cfg.trainer.stall_timeout_s, rank=int(os.environ.get("RANK", "0")))
        self.saved_step = -1
        self.save_due = False
        self.already_finished = False
        self.extra_hooks = list(hooks or [])
        self.hooks: list[Hook] = []

    @property
    def failing(self) -> bool:
        """Too many non-finite steps in a row: the loop stops after this step's hooks (no validation or save)."""
        return self.state.nonfinite_in_a_row >= self.trainer.max_nonfinite_in_a_row

    # ----- setup -------------------------------------------------------------------------------------------------
    def setup(self) -> None:
        from ..data import build_train_loader, build_val_batches, build_val_sets
        from ..data.loader import resolve_sources

        self.t_launch = time.monotonic()
        self.device = init_distributed(self.trainer.dist_timeout_minutes)
        self.rank, self.ws = rank(), world_size()
        resume = self.prepare_run_dir()
        weights = self.init_from(resume)
        tok = self.tokenizer(resume)
        if self.model_cfg.init_from is None:
            self.model_cfg.vocab_size = tok.vocab_size
        elif tok.vocab_size > self.model_cfg.padded_vocab_size:
            raise ValueError(f"model.init_from={self.model_cfg.init_from}: its embedding has "
                             f"{self.model_cfg.padded_vocab_size} rows, the tokenizer {tok.vocab_size} tokens; use "
                             f"its own tokenizer (data.tokenizer.path)")
        self.stats = model_stats(self.model_cfg, self.data_cfg.seq_len)
        self.precision = resolve_precision(self.trainer)
        self.ckpt = CheckpointManager(self.run_dir, self.trainer.keep_last)
        if resume is not None:
            check_model(resume, self.model_cfg)

        universal = resume is not None and needs_universal(resume, self.ws, self.trainer.zero_stage)
        self.ds_config = deepspeed_config(self.trainer, self.optim, self.budget, self.precision, universal)
        self.engine, self.optimizer = build_engine(self.model_cfg, self.trainer, self.optim, self.ds_config, self.seed,
                                                   weights)
        self.loader = build_train_loader(self.data_cfg, tok, self.rank, self.ws, self.budget.micro_batch_size)
        batch, n_val = self.trainer.val_batch_size or self.budget.micro_batch_size, self.trainer.val_batches
        sets = {MAIN_VAL: build_val_batches(self.data_cfg, tok, batch, n_val)}
        if len(resolve_sources(self.data_cfg, val=True)) > 1:  # several held-out sources: a loss for each as well
            sets.update(build_val_sets(self.data_cfg, tok, batch, n_val))
        client = self.load(resume, universal) if resume else None
        if client is None:
            self.state.wandb_id = all_gather_object(new_run_id())[0]
        if self.rank == 0 and not self.already_finished:  # a self-contained run directory: config and tokenizer
            self.run_obj.write_tokenizer(tok.tk.to_str())
            self.run_obj.write_config(self.config)
        self.validation = Validation(sets, self.trainer.val_every)
        evals = eval_hooks(self.trainer.eval, tok, self.data_cfg.seq_len, self.config)  # before a save at that step
        self.hooks = [MetricsLogger(), self.validation, *evals, Checkpointing(), *self.extra_hooks]
        self.peak = self.logging.peak_tflops or peak_tflops(device_name())
        self.last_save_t = time.monotonic()

    def prepare_run_dir(self) -> Optional[Checkpoint]:
        """Every rank finds the checkpoint to resume from (refusing what cannot be resumed); then rank 0 tidies
        run_dir: interrupted saves removed, a fresh start's old files moved aside."""
        mode, run = self.trainer.resume, self.run_obj
        resume = resume_point(run, mode)
        if self.rank == 0:
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ValueError(f"run_dir={self.run_dir}: cannot create it ({e.strerror})") from None
            CheckpointManager(self.run_dir, self.trainer.keep_last).remove_partial()
            if mode == "none":
                run.move_aside("trainer.resume=none")
            elif mode == "auto" and resume is None:
                run.move_aside("no checkpoint to resume from")
        barrier()
        return resume

    def init_from(self, resume: Optional[Checkpoint]) -> Optional[dict]:
        """model.init_from: the architecture (all but the runtime keys) is the pretrained model's; a new run also
        takes its weights (returned) and, unless data.tokenizer.path is set, its tokenizer. A relaunch resumes its
        own checkpoints as any run does."""
        src = self.model_cfg.init_from
        if not src:
            return None
        from ..export import load_pretrained
        from .resume import RUNTIME_KEYS

        runtime = {k: getattr(self.model_cfg, k) for k in RUNTIME_KEYS}
        if resume is not None:
            self.model_cfg = ModelConfig(**{**resume.meta["model"], **runtime})
            return None
        cfg, weights = load_pretrained(src)
        self.model_cfg = replace(cfg, **runtime)
        self.config["model"] = asdict(self.model_cfg)  # config.yaml and the checkpoints record what is trained
        tok_file = Run(src).dir / TOKENIZER_FILE
        if self.data_cfg.tokenizer.path is None and tok_file.is_file():
            self.data_cfg.tokenizer.path = str(tok_file)
            self.config["data"]["tokenizer"]["path"] = str(tok_file)
        say(f"model.init_from={src}: {cfg.arch}, {cfg.n_layers} layers, d_model {cfg.d_model}, vocab "
            f"{cfg.padded_vocab_size}; its weights, a fresh optimizer at step 0; tokenizer {self.data_cfg.tokenizer.path}")
        return weights

    def tokenizer(self, resume: Optional[Checkpoint]):
        """A resumed run keeps the tokenizer.json of its run directory (refusing another); a new run takes the
        configured one (the default BPE: trained once, by rank 0, and cached)."""
        from ..data import ensure_tokenizer, load_tokenizer

        kept = run_tokenizer_file(self.run_obj, resume)
        if kept is not None:
            tok_cfg = self.data_cfg.tokenizer
            saved = ((self.run_obj.config() or {}).get("data") or {}).get("tokenizer")
            now = (self.config.get("data") or {}).get("tokenizer") or {}
            changed = changed_keys(saved, now, ignore=("path",)) if saved else []
            if changed:
                raise ValueError(f"data.tokenizer: this run was trained with another tokenizer ({'; '.join(changed)}); "
                                 f"a resumed run keeps its own {kept}: use another run_dir for a new tokenizer")
            tok = load_tokenizer(str(kept), tok_cfg.eos_token)
            check_same_tokenizer(tok, tok_cfg.path, load_tokenizer(tok_cfg.path, tok_cfg.eos_token)
                                 if tok_cfg.path and Path(tok_cfg.path).resolve() != kept.resolve() else None)
            return tok
        if self.rank == 0:
            tok = ensure_tokenizer(self.data_cfg)
        barrier()
        return tok if self.rank == 0 else ensure_tokenizer(self.data_cfg)

    def load(self, res: Checkpoint, universal: bool) -> dict:
        tag = CheckpointManager.to_universal(res) if universal else res.tag
        try:
            path, client = self.engine.load_checkpoint(str(res.dir), tag=tag, load_lr_scheduler_states=False)
        except Exception as e:  # noqa: BLE001 - torch/DeepSpeed raise many types for a damaged file
            raise ValueError(f"{res.dir / tag}: cannot load this checkpoint ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:160] if str(e) else ''}); the checkpoint is damaged: resume an "
                             f"earlier one with trainer.resume=<its step folder>") from None
        if path is None:
            raise ValueError(f"{res.dir / tag}: DeepSpeed found no checkpoint files there; the checkpoint is damaged")
        saved = client["diffllm"]
        self.state = TrainState.from_dict(saved["train_state"])
        if self.run_obj.is_finished() and self.state.step >= self.budget.steps:
            check_finished_unchanged(self.run_obj, saved["config"], self.config)
            self.already_finished = True
        self.warn_changes(saved["config"])
        self.loader.load_state_dict(saved["data"])  # raises, naming the problem, if it cannot resume exactly
        set_rng_state(saved["rng"], self.rank)
        how = (f"a universal checkpoint (world size {saved['world_size']} -> {self.ws}, ZeRO-{res.zero_stage} -> "
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
            self.watchdog.beat("data")
            if step + 1 in self.trainer.inject_stall_at_steps and self.rank == 0:
                threading.Event().wait()  # fault injection (trainer.inject_stall_at_steps): a read that never returns
            if self.trainer.inject_step_delay_s and self.rank == 0 and micro == 0:
                time.sleep(self.trainer.inject_step_delay_s)  # fault injection: a slow node (the other ranks wait)
            batch = next(self.loader).to(self.device)  # (B, T+1)
            self.watchdog.beat("forward/backward")
            loss = lm_loss(self.engine, batch)
            if step + 1 in self.trainer.inject_nan_at_steps and self.rank == 0:
                loss = loss * float("nan")  # fault injection (trainer.inject_nan_at_steps): a real NaN, rank 0 only
            self.engine.backward(loss)  # DeepSpeed divides by grad_accum
            loss_sum += loss.detach()
            if micro == accum - 1:  # the update happens in the engine.step() below: agree first
                self.watchdog.beat("loss all-reduce")
                mean_loss, stop, self.save_due = self.agree(loss_sum.item())
                plain_norm = self.plain_grad_norm()
                self.optimizer.force_skip = not math.isfinite(mean_loss)
                self.optimizer.skipped, ds_skipped = False, self.engine.skipped_steps
                self.watchdog.beat("optimizer step")
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
               "step_time_s": time.perf_counter() - t0, "skipped": skipped}
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
        self.watchdog.beat("checkpoint save", allow_s=4 * self.trainer.stall_timeout_s)
        self.state.elapsed_s = self.elapsed()
        meta = {"step": self.state.step, "tokens": self.state.tokens, "world_size": self.ws,
                "zero_stage": self.trainer.zero_stage, "saved_at": time.time(), "model": asdict(self.model_cfg)}
        tag = self.ckpt.save(self.engine, self.state.step, self.client_state(), meta)
        self.saved_step, self.last_save_t = self.state.step, time.monotonic()
        say(f"checkpoint: saved {self.ckpt.dir / tag} ({time.monotonic() - t0:.1f} s)")
        for hook in self.hooks:
            hook.on_save(self, tag)

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.t_launch

    # ----- the run -----------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.stop.install()  # from the start: a signal during setup (imports, engine, checkpoint load) is not lost;
        try:  # the first step then finishes, saves and exits 3 like any other
            return self._run()
        finally:
            self.watchdog.stop()
            self.stop.restore()
            if getattr(self, "loader", None) is not None:
                self.loader.close()  # stops its DataLoader worker processes
            for hook in self.hooks:
                hook.close(self)

    def _run(self) -> int:
        self.setup()
        self.elapsed_before = self.state.elapsed_s
        self.saved_step = self.state.step if self.state.step else -1
        b = self.budget
        say(f"{self.model_cfg.name} ({self.model_cfg.arch}): {self.stats.total_params:,} params "
            f"({self.stats.nonembedding_params:,} non-embedding), {self.stats.flops_per_token:.3g} FLOPs/token")
        say(f"budget {b.tokens:,} tokens = {b.steps} steps x {b.global_batch_tokens:,} tokens "
            f"(micro-batch {b.micro_batch_size} x seq {b.seq_len} x grad-accum {b.grad_accum} x {self.ws} ranks); "
            f"ZeRO-{self.trainer.zero_stage}, {self.precision}, {device_name()}, run_dir {self.run_dir}")
        if b.note:
            say(f"note: {b.note}")
        if b.steps <= self.optim.warmup_steps and self.optim.schedule != "constant":
            say(f"warning: the run has {b.steps} steps and optim.warmup_steps={self.optim.warmup_steps}: the learning "
                f"rate only warms up (to optim.lr at the last step) and never decays", error=True)
        self.watchdog.start()  # from here every phase of a step beats; a rank that stops making progress exits 5
        return self.loop()

    def loop(self) -> int:
        b, s, t = self.budget, self.state, self.trainer
        if s.step < b.steps and self.rank == 0:
            self.run_obj.summary_path().unlink(missing_ok=True)  # stale until this run finishes
        for hook in self.hooks:
            hook.on_start(self)
        trained = False
        while s.step < b.steps:
            rec, stop = self.train_step()
            trained = True
            for hook in self.hooks:
                hook.on_step_end(self, rec)
            if self.failing:
                last = self.run_obj.latest()
                say(f"error: {s.nonfinite_in_a_row} steps in a row had a non-finite loss or gradient (step {s.step}); "
                    f"stopping (trainer.max_nonfinite_in_a_row={t.max_nonfinite_in_a_row}); the last checkpoint: "
                    f"{last.path if last else 'none'} (exit code {EXIT_NONFINITE})", error=True)
                return EXIT_NONFINITE
            if stop and s.step < b.steps:
                self.save()
                say(f"stopped by {self.stop.received or 'a signal on another rank'} at step {s.step}; "
                    f"relaunch the same command to continue (exit code {EXIT_PREEMPTED})")
                return EXIT_PREEMPTED
        if not trained and self.saved_step == s.step and (self.already_finished or s.step == b.steps):
            say(f"the run is already at its budget ({b.tokens:,} tokens): raise trainer.tokens to train on, or "
                f"trainer.resume=none to start afresh")
            if self.already_finished:
                return EXIT_FINISHED  # its summary.json stays as it was written
        else:
            self.validation.validate(self)
        self.save()
        self.finish()
        return EXIT_FINISHED

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
            "device": device_name(), "skipped_steps": s.skipped_steps, "status": "finished", "seed": self.seed,
            "checkpoint": str(self.ckpt.dir / f"step{s.step}"), "run_dir": str(self.run_dir),
        }
        if self.rank == 0:
            self.run_obj.write_summary(summary)
            say(f"finished: {s.tokens:,} tokens, final train loss {summary['final_train_loss']}, "
                f"val loss {summary['final_val_loss']}, {summary['wall_time_s']:.0f} s -> {self.run_dir / 'summary.json'}")
        for hook in self.hooks:
            hook.on_finish(self, summary)
