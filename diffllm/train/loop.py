"""The Trainer: setup from a resume plan, then a short loop of steps to the token budget, with exit codes for
preemption, non-finite steps and spikes. The step is step.py's `Step`; what happens around it (the summary, window
metrics, diagnostics, in-loop evaluation, fault injection, save timing, branch points, a user's own) are hooks that see
a `View` (hooks.py) and return what they add to the step's record, which one writer logs last (metrics.py); the parts
share one `LaunchContext` (context.py); where a run continues from is checkpoints/plan.py's plan over one snapshot of
the run directory; what a checkpoint holds is checkpoints/state.py's Resumable; every save is `save`'s."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

from ..budget import plan_branching
from ..errors import UserError
from ..model.accounting import model_stats
from ..runs import Run
from .checkpoints.plan import ResumePlan, plan_resume
from .checkpoints.save import CheckpointManager
from .checkpoints.snapshot import RunSnapshot
from .checkpoints.state import Resumable, TrainState
from .config import TrainConfig, plan_budget
from .context import LaunchContext
from .diagnostics import diagnostics_hooks
from .dist import all_gather_object, barrier, init_distributed, rank, set_env_defaults, world_size
from .engine import build_engine, deepspeed_config, resolve_precision
from .eval_hook import eval_hooks
from .faults import fault_hooks
from .final_val import FinalValidation
from .hooks import Checkpointing, Hook, Hooks, StepMetrics, View
from .lock import hold_run_dir
from .metrics import MetricsWriter, device_name, peak_tflops
from .optim import UpdateGate
from .signals import StopFlag
from .spikes import SpikeGuard
from .step import Asks, Step
from .summary import Summary, bad_records, banner, summary_of
from .tracking import new_run_id, open_wandb
from .validation import MAIN_VAL, Validation, val_losses_record
from .watchdog import STALL_EXIT_CODE, Watchdog

EXIT_FINISHED = 0
EXIT_PREEMPTED = 3  # a stop signal arrived; the step finished and a checkpoint was saved: relaunch to continue
EXIT_NONFINITE = 4  # trainer.max_nonfinite_in_a_row consecutive steps had a non-finite loss or gradient
EXIT_STALLED = STALL_EXIT_CODE  # 5: no progress for trainer.stall_timeout_s (the watchdog names the stalled phase)
EXIT_SPIKES = 7  # trainer.spikes: a spike with action=stop, or max_consecutive_skips skipped in a row; saved first


def say(msg: str, error: bool = False) -> None:
    if rank() == 0:
        print(f"[diffllm.train] {msg}", file=sys.stderr if error else sys.stdout, flush=True)


class Trainer:
    """`Trainer(TrainConfig.from_hydra(cfg), hooks=[...]).run()`. Built-in hooks: Summary, StepMetrics,
    DiagnosticsHook, in-loop evaluation, fault injection, Checkpointing, branch points (in that order); `hooks` are
    called after them, each with the run's View (see hooks.py)."""

    def __init__(self, cfg: TrainConfig, hooks: Optional[list[Hook]] = None):
        self.cfg = cfg
        set_env_defaults()  # a plain single process is a world of one; checked here, before any heavy setup
        self.budget = plan_budget(cfg.trainer, cfg.data.seq_len, int(os.environ["WORLD_SIZE"]))
        self.run_dir = Path(cfg.run_dir)
        self.run_obj = Run(self.run_dir)  # a run_dir that is a file: a one-line error, before anything starts
        if self.run_obj.dir != self.run_dir:
            raise UserError(
                f"run_dir={self.run_dir}: a checkpoints or step folder, not a run directory; did you mean "
                f"run_dir={self.run_obj.dir} (or trainer.resume={self.run_dir})?"
            )
        self.state, self.asks, self.spikes = TrainState(), Asks(StopFlag()), SpikeGuard(cfg.trainer.spikes)
        self.watchdog = Watchdog(cfg.trainer.stall_timeout_s, rank=int(os.environ.get("RANK", "0")))
        self.saved_step = -1
        self.extra_hooks = list(hooks or [])
        self.hooks: Optional[Hooks] = None
        self.loader = self.writer = self.lock = None

    @property
    def failing(self) -> bool:
        """Too many non-finite steps in a row: the loop stops after this step's hooks (no validation or save)."""
        return self.state.nonfinite_in_a_row >= self.cfg.trainer.max_nonfinite_in_a_row

    # ----- setup -------------------------------------------------------------------------------------------------
    def setup(self) -> ResumePlan:
        """Processes up, the resume plan, then what it names built in order: inputs (data, validation, evaluation;
        checked before any write), run_dir's first writes (rank 0), the engine and its checkpoint, the hooks."""
        self.t_launch = time.monotonic()
        plan = self.plan()
        cfg = self.cfg = plan.config  # what is trained: config.yaml and the checkpoints record this one
        if plan.finished:  # its result is final: nothing is built, converted, loaded or written
            return self.open_finished(plan)
        self.run_obj.check_writable()  # a read-only run_dir: one line now, not a traceback at its first write
        self.build_inputs(plan)
        self.lock = hold_run_dir(self.run_obj, self.ctx.rank)  # one job per run_dir (runlock.py), before any write
        if self.ctx.rank == 0:
            self.begin(plan)
        barrier()
        self.ckpt = CheckpointManager(self.run_dir, cfg.trainer.keep_last, plan.branches.pinned_tags())
        ds_config = deepspeed_config(cfg.trainer, cfg.optim, self.budget, self.precision, plan.universal)
        self.engine, optimizer = build_engine(
            cfg.model, cfg.trainer, cfg.optim, ds_config, cfg.seed, UpdateGate(), plan.weights
        )
        self.step = Step(self.ctx, cfg.optim, self.engine, optimizer, self.loader, self.spikes)
        if plan.checkpoint is not None:
            self.load(plan)
        else:
            self.state.wandb_id = all_gather_object(new_run_id())[0]
        if self.ctx.rank == 0:  # a self-contained run directory: config and tokenizer
            self.run_obj.write_tokenizer(plan.tokenizer.tk.to_str())
            self.run_obj.write_config(cfg.resolved)
        self.view = View(
            self.ctx,
            self.state,
            model=lambda: self.engine,
            log=self.log,
            request_save=self.asks.request_save,
            elapsed=self.elapsed,
            failing=lambda: self.failing,
        )
        self.hooks = Hooks([*self.built_in_hooks(plan), *self.extra_hooks], self.view)
        b = self.budget
        self.writer = MetricsWriter(self.ctx.rank, cfg.trainer.log_every, b.steps, b.tokens, b.global_batch_tokens)
        return plan

    def plan(self) -> ResumePlan:
        """The launch's processes and context, then its resume plan over one snapshot of the run directory."""
        cfg = self.cfg
        device = init_distributed(cfg.trainer.dist_timeout_minutes)
        branching = plan_branching(cfg.trainer, cfg.optim, self.budget)
        beat = self.watchdog.beat
        self.ctx = LaunchContext(rank(), world_size(), device, self.budget, branching, self.run_obj, say, beat)
        snap = RunSnapshot.read(self.run_obj, cfg.trainer.resume, cfg.trainer.branch_from, cfg.model.init_from)
        return plan_resume(cfg, snap, self.ctx)

    def open_finished(self, plan: ResumePlan) -> ResumePlan:
        """A finished run at its budget: its state is read, nothing is built or written (interrupted saves aside)."""
        self.state = TrainState.from_dict(plan.saved["train_state"])
        hold_run_dir(self.run_obj, self.ctx.rank, take=False)  # refused while another job writes the run
        if self.ctx.rank == 0:
            self.run_obj.remove_partial()  # saves that never completed (never published) are no part of it
        say(
            f"{plan.checkpoint.path}: the finished run's last checkpoint (step {self.state.step}, "
            f"{self.state.tokens:,} tokens; summary.json)"
        )
        return plan

    def build_inputs(self, plan: ResumePlan) -> None:
        """The data loader, validation sets, final validation, resumable state and evaluation hooks: each checked
        (the checkpoint's data state against this launch's loader, evaluation windows) before anything is written."""
        from ..data import build_train_loader
        from ..data.loader import validation_sets

        cfg, ctx, tok = self.cfg, self.ctx, plan.tokenizer
        data, trainer = cfg.data, cfg.trainer
        self.stats = model_stats(cfg.model, data.seq_len)
        self.precision = resolve_precision(trainer)
        self.loader = build_train_loader(
            data, tok, ctx.rank, ctx.world_size, self.budget.micro_batch_size, pin_memory=ctx.device.type == "cuda"
        )
        batch, n_val = trainer.val_batch_size or self.budget.micro_batch_size, trainer.val_batches
        # several held-out sources: a loss for each as well
        sets = validation_sets(data, tok, batch, n_val, trainer.val_tokens, MAIN_VAL)
        self.validation = Validation(sets, trainer.val_every)
        self.final_val = FinalValidation(cfg.resolved, tok, data.seq_len, batch, trainer.val_tokens)
        self.resumable = Resumable(cfg, ctx, self.state, self.loader)
        if plan.saved is not None:
            try:  # e.g. a world size its data streams cannot take, or changed sources: before any write
                self.resumable.check(plan.saved)
            except UserError as e:
                raise UserError(f"{plan.checkpoint.path}: {e}") from None
        self.evals = eval_hooks(trainer.eval, tok, data.seq_len, cfg.resolved)
        for hook in self.evals:
            hook.prepare(cfg.model.max_seq_len)  # its windows and prompts: ones that cannot be built fail here

    def built_in_hooks(self, plan: ResumePlan) -> list[Hook]:
        trainer = self.cfg.trainer
        peak = self.cfg.logging.peak_tflops or peak_tflops(device_name())
        return [
            Summary(),
            StepMetrics(trainer.log_every, self.stats.flops_per_token, peak),
            *diagnostics_hooks(trainer.diagnostics, trainer.log_every),
            *self.evals,
            *fault_hooks(trainer.faults),
            Checkpointing(trainer.save_every_steps, trainer.save_every_minutes),
            *plan.branches.hooks(),
        ]

    def begin(self, plan: ResumePlan) -> None:
        """Rank 0, once every input is checked: the first writes into run_dir. A fresh start moves the old run's files
        aside; run_dir is created (interrupted saves removed); a branch writes branch.json and its parent's metrics."""
        if plan.fresh is not None:
            self.run_obj.move_aside(plan.fresh)
        self.run_obj.prepare()
        if plan.branches.source is not None:
            plan.branches.begin(self.run_obj, ((plan.saved or {}).get("train_state") or {}).get("elapsed_s"))

    def load(self, plan: ResumePlan) -> None:
        client, tag = self.ckpt.load(self.engine, plan.checkpoint, plan.universal)
        saved = Resumable.saved(client)
        self.resumable.restore(saved, self.ctx.rank)  # raises, naming the problem, if the data cannot resume exactly
        self.state = self.resumable.state
        res = plan.checkpoint
        how = (
            f"a universal checkpoint (world size {saved['world_size']} -> {self.ctx.world_size}, "
            f"ZeRO-{res.zero_stage} -> {self.cfg.trainer.zero_stage})"
            if plan.universal
            else "checkpoint"
        )
        say(f"resumed from {how} {res.dir / tag}: step {self.state.step}, {self.state.tokens:,} tokens")
        if plan.branches.source is not None:  # its own run: its own W&B run, not the parent's
            self.state.wandb_id = all_gather_object(new_run_id())[0]
            plan.branches.describe(say)

    # ----- what the View offers ----------------------------------------------------------------------------------
    def log(self, record: dict) -> None:
        """A metrics.jsonl record of its own (rank 0 writes it, and to W&B, after the step's record)."""
        self.writer.add(record)

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.t_launch

    # ----- the one place a checkpoint is saved -------------------------------------------------------------------
    def save(self) -> None:
        if self.saved_step == self.state.step:
            return
        t0 = time.monotonic()
        self.watchdog.beat("checkpoint save", allow_s=4 * self.cfg.trainer.stall_timeout_s)
        self.state.elapsed_s = self.elapsed()
        tag = self.ckpt.save(self.engine, self.state.step, self.resumable.client_state(), self.resumable.meta())
        self.saved_step = self.state.step
        say(f"checkpoint: saved {self.ckpt.dir / tag} ({time.monotonic() - t0:.1f} s)")
        self.hooks.call("on_save", tag)

    def say_at_budget(self) -> None:
        say(
            f"the run is already at its budget ({self.budget.tokens:,} tokens): raise trainer.tokens to train on, or "
            f"trainer.resume=none to start afresh"
        )

    # ----- the run -----------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.asks.stop.install()  # from the start: a signal during setup (imports, engine, checkpoint load) is not
        try:  # lost; the first step then finishes, saves and exits 3 like any other
            if self.setup().finished:
                self.say_at_budget()
                return EXIT_FINISHED  # its summary.json stays as it was written
            self.elapsed_before = self.state.elapsed_s
            self.saved_step = self.state.step if self.state.step else -1
            banner(self.cfg, self.budget, self.stats, self.precision, say)
            self.watchdog.start()  # from here every phase of a step beats; a rank that stops making progress exits 5
            return self.loop()
        finally:
            self.watchdog.stop()
            self.asks.stop.restore()
            if self.loader is not None:
                self.loader.close()  # stops its DataLoader worker processes
            if self.hooks is not None:
                self.hooks.call("close")
            if self.writer is not None:
                self.writer.close()
            if self.lock is not None:
                self.lock.release()

    def validate(self, record: bool = True) -> None:
        """A validation; a recorded one is logged and told to the hooks (on_validate)."""
        losses = self.validation.validate(self.view)
        if record:
            self.writer.add(val_losses_record(self.state.step, self.state.tokens, losses))
            self.hooks.call("on_validate", losses)
            self.writer.flush()

    def loop(self) -> int:
        b, s = self.budget, self.state
        self.writer.open(
            self.run_dir, s.step, lambda: open_wandb(self.cfg.logging, self.run_dir, s.wandb_id, self.cfg.resolved), say
        )
        self.validate(record=s.step == 0)  # a resumed run's step was validated and recorded before
        self.hooks.call("on_start")
        self.writer.flush()
        trained, code = False, None
        while code is None:
            if s.step < b.steps:
                record, stop = self.step(s, self.hooks, self.asks)
                trained = True
                self.writer.step(self.hooks.step_end(record))  # every hook's keys, then the one write
                if self.validation.due(self.view):
                    self.validate()
                code = self.stopping(stop)
            if code is None and s.step >= b.steps:
                if not trained and self.saved_step == s.step:  # saved at the budget, summary.json not yet written
                    self.say_at_budget()
                else:
                    self.validate()
                code = EXIT_FINISHED
            if code != EXIT_NONFINITE and (self.asks.save or code is not None):
                self.save()
            self.asks.save = False
        self.say_exit(code)
        return code

    def stopping(self, stop: bool) -> Optional[int]:
        """Why the run stops after this step (an exit code), or None: it trains on."""
        if self.failing:
            return EXIT_NONFINITE
        if self.spikes.stopping():
            return EXIT_SPIKES
        if stop and self.state.step < self.budget.steps:
            return EXIT_PREEMPTED
        return None

    def say_exit(self, code: int) -> None:
        """The line of the exit (after the save it made), or the finished run's summary."""
        s, t = self.state, self.cfg.trainer
        if code == EXIT_FINISHED:
            final = self.final_val.evaluate(self.view)  # collective: the whole held-out set, as `eval ppl` scores it
            scored = "; ".join(final["scored"])
            say(f"final validation: loss {final['loss']:.4f} over {final['tokens']:,} tokens ({scored})")
            skipped = bad_records(self.loader)  # collective: every rank finishes here
            summary = summary_of(self.cfg, self.budget, self.stats, self.precision, s, self.run_obj, skipped, final)
            self.hooks.call("on_finish", summary)
        elif code == EXIT_NONFINITE:
            last = self.run_obj.latest()
            say(
                f"error: {s.nonfinite_in_a_row} steps in a row had a non-finite loss or gradient (step {s.step}); "
                f"stopping (trainer.max_nonfinite_in_a_row={t.max_nonfinite_in_a_row}); the last "
                f"checkpoint: {last.path if last else 'none'} (exit code {EXIT_NONFINITE})",
                error=True,
            )
        elif code == EXIT_SPIKES:
            saved = self.ckpt.dir / f"step{s.step}"
            say(
                f"error: {self.spikes.stopping()} at step {s.step}; stopping after saving {saved} (exit code "
                f"{EXIT_SPIKES}); relaunch to continue past the spike",
                error=True,
            )
        else:
            say(
                f"stopped by {self.asks.stop.received or 'a signal on another rank'} at step {s.step}; "
                f"relaunch the same command to continue (exit code {EXIT_PREEMPTED})"
            )
