"""The Trainer: setup from a resume plan, then a short loop of steps to the token budget, with exit codes for
preemption and non-finite steps. The step body is step.py's; validation, save timing, metrics, the summary, in-loop
evaluation and fault injection are hooks (hooks.py, summary.py, eval_hook.py, faults.py); where a run continues from
is resume.py's plan; what a checkpoint holds is state.py's Resumable."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

from ..model.accounting import model_stats
from ..runs import Checkpoint, Run
from . import branch
from .checkpoint import CheckpointManager
from .config import TrainConfig, plan_budget
from .dist import all_gather_object, barrier, init_distributed, rank, set_env_defaults, world_size
from .engine import build_engine, deepspeed_config, resolve_precision
from .eval_hook import eval_hooks
from .faults import fault_hooks
from .hooks import MAIN_VAL, Checkpointing, Hook, MetricsLogger, Validation
from .metrics import device_name, peak_tflops
from .resume import ResumePlan, note_changes, plan_resume
from .signals import StopFlag
from .spikes import SpikeGuard
from .state import Resumable, TrainState
from .step import train_step
from .summary import Summary, banner, summary_of
from .tracking import new_run_id
from .watchdog import STALL_EXIT_CODE, Watchdog
from ..errors import UserError

EXIT_FINISHED = 0
EXIT_PREEMPTED = 3  # a stop signal arrived; the step finished and a checkpoint was saved: relaunch to continue
EXIT_NONFINITE = 4  # trainer.max_nonfinite_in_a_row consecutive steps had a non-finite loss or gradient
EXIT_STALLED = STALL_EXIT_CODE  # 5: no progress for trainer.stall_timeout_s (the watchdog names the stalled phase)
EXIT_SPIKES = 7  # trainer.spikes: a spike with action=stop, or max_consecutive_skips skipped in a row; saved first


def say(msg: str, error: bool = False) -> None:
    if rank() == 0:
        print(f"[diffllm.train] {msg}", file=sys.stderr if error else sys.stdout, flush=True)


class Trainer:
    """`Trainer(TrainConfig.from_hydra(cfg), hooks=[...]).run()`. Built-in hooks: Summary, MetricsLogger,
    Validation, in-loop evaluation, fault injection, Checkpointing (in that order); `hooks` are called after them.
    Hooks talk back through `log`, `request_save` and `call_hooks` (see hooks.py)."""

    say = staticmethod(say)

    def __init__(self, cfg: TrainConfig, hooks: Optional[list[Hook]] = None):
        self.cfg, self.config, self.seed = cfg, cfg.resolved, cfg.seed
        self.trainer, self.optim, self.logging, self.data_cfg = cfg.trainer, cfg.optim, cfg.logging, cfg.data
        set_env_defaults()  # a plain single process is a world of one; checked here, before any heavy setup
        self.budget = plan_budget(self.trainer, self.data_cfg.seq_len, int(os.environ["WORLD_SIZE"]))
        self.branch_points = branch.branch_points(cfg, self.budget)  # {step: budget}: checkpoints kept for branches
        self.run_dir = Path(cfg.run_dir)
        self.run_obj = Run(self.run_dir)  # a run_dir that is a file: a one-line error, before anything starts
        if self.run_obj.dir != self.run_dir:
            raise UserError(f"run_dir={self.run_dir}: a checkpoints or step folder, not a run directory; did you mean "
                             f"run_dir={self.run_obj.dir} (or trainer.resume={self.run_dir})?")
        self.state, self.stop, self.spikes = TrainState(), StopFlag(), SpikeGuard(cfg.trainer.spikes)
        self.watchdog = Watchdog(cfg.trainer.stall_timeout_s, rank=int(os.environ.get("RANK", "0")))
        self.saved_step, self.already_finished = -1, False
        self.save_wish = self.save_requested = False  # request_save(agree=True) / request_save()
        self.extra_hooks, self.hooks = list(hooks or []), []
        self.loader = None

    @property
    def failing(self) -> bool:
        """Too many non-finite steps in a row: the loop stops after this step's hooks (no validation or save)."""
        return self.state.nonfinite_in_a_row >= self.trainer.max_nonfinite_in_a_row

    # ----- what hooks may ask --------------------------------------------------------------------------------------
    def log(self, record: dict) -> None:
        """A metrics.jsonl record (rank 0 writes it, and to W&B)."""
        if self.rank == 0 and self.metrics.log is not None:
            self.metrics.log.write(record)

    def request_save(self, agree: bool = False) -> None:
        """A checkpoint at the end of this step. agree=True: this rank's wish alone (a clock), made every rank's
        request by the step's one collective; call it before the step's loss is agreed (on_step_start)."""
        if agree:
            self.save_wish = True
        else:
            self.save_requested = True

    def call_hooks(self, event: str, *args) -> None:
        for hook in self.hooks:
            getattr(hook, event)(self, *args)

    # ----- setup -------------------------------------------------------------------------------------------------
    def setup(self) -> None:
        from ..data import build_train_loader, build_val_batches, build_val_sets
        from ..data.loader import resolve_sources

        self.t_launch = time.monotonic()
        self.device = init_distributed(self.trainer.dist_timeout_minutes)
        self.rank, self.ws = rank(), world_size()
        plan = plan_resume(self.cfg, self.run_obj, self.rank, self.ws, self.budget.steps, say)
        self.model_cfg, tok = plan.model, plan.tokenizer
        if plan.finished:  # its result is final: nothing is built, converted, loaded or rewritten
            self.already_finished, self.state = True, TrainState.from_dict(plan.saved["train_state"])
            if self.rank == 0:
                self.run_obj.remove_partial()  # saves that never completed (never published) are no part of it
            say(f"{plan.checkpoint.path}: the finished run's last checkpoint (step {self.state.step}, "
                f"{self.state.tokens:,} tokens; summary.json)")
            return
        self.stats = model_stats(self.model_cfg, self.data_cfg.seq_len)
        self.precision = resolve_precision(self.trainer)
        self.loader = build_train_loader(self.data_cfg, tok, self.rank, self.ws, self.budget.micro_batch_size)
        batch, n_val = self.trainer.val_batch_size or self.budget.micro_batch_size, self.trainer.val_batches
        sets = {MAIN_VAL: build_val_batches(self.data_cfg, tok, batch, n_val)}
        if len(resolve_sources(self.data_cfg, val=True)) > 1:  # several held-out sources: a loss for each as well
            sets.update(build_val_sets(self.data_cfg, tok, batch, n_val))
        self.resumable = Resumable(self.state, self.loader, self.config, self.model_cfg, self.ws,
                                   self.trainer.zero_stage, self.optim.schedule, self.budget.steps)
        if plan.saved is not None:
            self.resumable.check(plan.saved)  # e.g. a world size its data streams cannot take: before any write
        if self.rank == 0:
            self.run_obj.prepare()  # every input is checked: run_dir is created (interrupted saves removed)
            if plan.branch is not None:  # with the parent's wall time at the branch (the cooldown's own: the rest)
                saved_state = (plan.saved or {}).get("train_state") or {}
                branch.begin(self.run_obj, {**plan.branch, "parent_elapsed_s": saved_state.get("elapsed_s")})
        barrier()
        self.ckpt = CheckpointManager(self.run_dir, self.trainer.keep_last, branch.pinned_tags(self.branch_points))
        self.ds_config = deepspeed_config(self.trainer, self.optim, self.budget, self.precision, plan.universal)
        self.engine, self.optimizer = build_engine(self.model_cfg, self.trainer, self.optim, self.ds_config, self.seed,
                                                   plan.weights)
        if plan.checkpoint is not None:
            self.load(plan)
        else:
            self.state.wandb_id = all_gather_object(new_run_id())[0]
        if self.rank == 0:  # a self-contained run directory: config and tokenizer
            self.run_obj.write_tokenizer(tok.tk.to_str())
            self.run_obj.write_config(self.config)
        self.validation, self.metrics = Validation(sets, self.trainer.val_every), MetricsLogger()
        evals = eval_hooks(self.trainer.eval, tok, self.data_cfg.seq_len, self.config)  # before a save at that step
        self.hooks = [Summary(), self.metrics, self.validation, *evals, *fault_hooks(self.trainer), Checkpointing(),
                      *([branch.BranchPoints(self.branch_points)] if self.branch_points else []), *self.extra_hooks]
        self.peak = self.logging.peak_tflops or peak_tflops(device_name())

    def load(self, plan: ResumePlan) -> None:
        res: Checkpoint = plan.checkpoint
        client, tag = self.ckpt.load(self.engine, res, plan.universal)
        saved = Resumable.saved(client)
        if plan.branch is None:
            note_changes(saved["config"], self.config, say)
        self.resumable.restore(saved, self.rank)  # raises, naming the problem, if the data cannot resume exactly
        self.state = self.resumable.state
        how = (f"a universal checkpoint (world size {saved['world_size']} -> {self.ws}, ZeRO-{res.zero_stage} -> "
               f"{self.trainer.zero_stage})" if plan.universal else "checkpoint")
        say(f"resumed from {how} {res.dir / tag}: step {self.state.step}, {self.state.tokens:,} tokens")
        if plan.branch is not None:  # its own run: its own W&B run, not the parent's
            self.state.wandb_id = all_gather_object(new_run_id())[0]
            branch.describe(plan.branch, say)

    def save(self) -> None:
        if self.saved_step == self.state.step:
            return
        t0 = time.monotonic()
        self.watchdog.beat("checkpoint save", allow_s=4 * self.trainer.stall_timeout_s)
        self.state.elapsed_s = self.elapsed()
        tag = self.ckpt.save(self.engine, self.state.step, self.resumable.client_state(), self.resumable.meta())
        self.saved_step = self.state.step
        say(f"checkpoint: saved {self.ckpt.dir / tag} ({time.monotonic() - t0:.1f} s)")
        self.call_hooks("on_save", tag)

    def say_at_budget(self) -> None:
        say(f"the run is already at its budget ({self.budget.tokens:,} tokens): raise trainer.tokens to train on, or "
            f"trainer.resume=none to start afresh")

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.t_launch

    # ----- the run -----------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.stop.install()  # from the start: a signal during setup (imports, engine, checkpoint load) is not lost;
        try:  # the first step then finishes, saves and exits 3 like any other
            self.setup()
            if self.already_finished:
                self.say_at_budget()
                return EXIT_FINISHED  # its summary.json stays as it was written
            self.elapsed_before = self.state.elapsed_s
            self.saved_step = self.state.step if self.state.step else -1
            banner(self)
            self.watchdog.start()  # from here every phase of a step beats; a rank that stops making progress exits 5
            return self.loop()
        finally:
            self.watchdog.stop()
            self.stop.restore()
            if self.loader is not None:
                self.loader.close()  # stops its DataLoader worker processes
            for hook in self.hooks:
                hook.close(self)

    def loop(self) -> int:
        b, s = self.budget, self.state
        self.call_hooks("on_start")
        trained = False
        while s.step < b.steps:
            rec, stop = train_step(self)
            trained = True
            self.call_hooks("on_step_end", rec)
            if self.failing:
                last = self.run_obj.latest()
                say(f"error: {s.nonfinite_in_a_row} steps in a row had a non-finite loss or gradient (step {s.step}); "
                    f"stopping (trainer.max_nonfinite_in_a_row={self.trainer.max_nonfinite_in_a_row}); the last "
                    f"checkpoint: {last.path if last else 'none'} (exit code {EXIT_NONFINITE})", error=True)
                return EXIT_NONFINITE
            why = self.spikes.stopping()
            if why:
                self.save()
                say(f"error: {why} at step {s.step}; stopping after saving {self.ckpt.dir / f'step{s.step}'} (exit code "
                    f"{EXIT_SPIKES}); relaunch to continue past the spike", error=True)
                return EXIT_SPIKES
            if self.save_requested and s.step < b.steps:
                self.save()
            self.save_requested = False
            if stop and s.step < b.steps:
                self.save()
                say(f"stopped by {self.stop.received or 'a signal on another rank'} at step {s.step}; "
                    f"relaunch the same command to continue (exit code {EXIT_PREEMPTED})")
                return EXIT_PREEMPTED
        if not trained and self.saved_step == s.step == b.steps:  # saved at the budget, summary.json not yet written
            self.say_at_budget()
        else:
            self.validation.validate(self)
        self.save()
        self.call_hooks("on_finish", summary_of(self))
        return EXIT_FINISHED
