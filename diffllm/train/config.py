"""Typed configs of the trainer (`trainer`, `optim`, `logging` groups) and `TrainConfig`, all of them together (the
token-budget arithmetic is diffllm/budget.py's). A field's role on resume is its metadata (`resume`: see ROLES)."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, Optional

from ..budget import Budget, Tokens, plan_budget  # noqa: F401 - re-exported: the trainer's budget
from ..counts import parse_count
from ..errors import UserError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..data import DataConfig
    from ..model import ModelConfig

# The roles a config key may play on resume (dataclass field metadata {"resume": (role, ...)}, read by resume.py):
#   operational  how a run is executed or logged, not what it computes: any relaunch may change it, even of a finished
#                run, and a branch may set it otherwise than its parent
#   branch       a WSD branch may set it otherwise than its parent (its budget, validation, the ZeRO layout of the
#                same global batch); a finished run's relaunch still compares it
#   kept         a model key that is how this launch runs the model, not its architecture: kept over a checkpoint's
#                or model.init_from's architecture
#   label        a model key that names the model, not its architecture (what was loaded calls it)
ROLES = ("operational", "branch", "kept", "label")
OPERATIONAL = {"resume": ("operational",)}
BRANCH = {"resume": ("branch",)}


def operational(default: Any = MISSING, factory: Any = MISSING) -> Any:
    """A field of role operational (see ROLES)."""
    return field(default=default, default_factory=factory, metadata=OPERATIONAL)


def branch_free(default: Any = MISSING) -> Any:
    """A field of role branch (see ROLES)."""
    return field(default=default, metadata=BRANCH)


def _bad(key: str, why: str) -> NoReturn:
    raise UserError(f"{key}: {why}")


PRECISIONS = ("auto", "fp32", "bf16")
DIAGNOSTICS = ("off", "cheap", "full")  # trainer.diagnostics levels (diffllm/train/diagnostics.py)
SCHEDULES = ("linear", "cosine", "wsd", "constant")
WANDB_MODES = ("auto", "online", "offline", "disabled")
NEEDLE_MODES = ("synthetic", "text")
SPIKE_ACTIONS = ("log", "skip", "stop")


@dataclass
class EvalConfig:
    """In-loop evaluation (`trainer.eval`, run by diffllm/train/eval_hook.py): diffllm/eval's perplexity / bits per
    byte on extra data configs, multi-needle retrieval and associative-recall accuracy, every `every` steps and/or
    after the last step.
    Off by default; on when `every` > 0 or `at_end`, with at least one measure chosen."""

    every: int = 0  # steps between evaluations (0: none during training)
    at_end: bool = False  # also evaluate after the last step
    ppl_data: list = field(default_factory=list)  # data configs (as data=...) whose held-out sources get loss, bpb
    ppl_max_tokens: Optional[int] = 8192  # document tokens scored per source (null: every held-out document)
    batch_size: int = 8  # windows (ppl) or prompts (needle) per forward
    needle_n: list = field(default_factory=list)  # numbers of needles N to retrieve ([]: no needle evaluation)
    needle_mode: str = "synthetic"  # synthetic (filler words; micro models learn it) | text (the run's held-out text)
    needle_trials: int = 8  # prompts per N x depth
    needle_depths: list = field(default_factory=lambda: [0.0, 50.0, 100.0])  # answer-needle depths, % of the context
    needle_queries: int = 1  # keys queried per prompt (at most N)
    needle_length: Optional[int] = None  # prompt length in tokens (null: data.seq_len)
    needle_seed: int = 0  # the prompts' own generator (never the training RNG)
    recall_n: list = field(default_factory=list)  # associative recall (eval recall) for these N ([]: none)
    recall_gaps: list = field(default_factory=lambda: [0, 16])  # filler words between the pairs and the queries
    recall_length: int = 64  # words per recall prompt
    recall_trials: int = 16  # held-out prompts per N x gap
    recall_seed: int = 0  # the recall prompts' own generator (never the training RNG)

    @property
    def on(self) -> bool:
        return bool(self.every or self.at_end)

    def validate(self) -> None:
        import difflib

        from ..config import find_config, group_options
        from ..eval.config import NeedleTask, RecallTask

        if self.every < 0:
            _bad("trainer.eval.every", f"must be >= 0, got {self.every}")
        for key in ("batch_size", "needle_trials", "needle_queries", "recall_trials"):
            if getattr(self, key) < 1:
                _bad(f"trainer.eval.{key}", f"must be >= 1, got {getattr(self, key)}")
        for key in ("ppl_max_tokens", "needle_length"):
            if getattr(self, key) is not None and getattr(self, key) < 2:
                _bad(f"trainer.eval.{key}", f"must be >= 2 or null, got {getattr(self, key)}")
        if self.needle_mode not in NEEDLE_MODES:
            _bad("trainer.eval.needle_mode", f"got {self.needle_mode!r}, expected one of {NEEDLE_MODES}")
        for name in self.ppl_data:
            if not isinstance(name, str) or find_config("data", name) is None:
                options = group_options("data")
                near = difflib.get_close_matches(str(name), options, n=1, cutoff=0.5)
                _bad(
                    "trainer.eval.ppl_data",
                    f"unknown data config {name!r}"
                    + (f" (did you mean {near[0]}?)" if near else f" (options: {', '.join(options)})"),
                )
        needle = NeedleTask(
            mode=self.needle_mode,
            n_needles=list(self.needle_n),
            queries=self.needle_queries,
            depths=list(self.needle_depths),
            trials=self.needle_trials,
        )
        recall = RecallTask(n=list(self.recall_n), gaps=list(self.recall_gaps), lengths=[self.recall_length])
        ours = dict(n_needles="needle_n", depths="needle_depths", queries="needle_queries", trials="needle_trials")
        ours.update(mode="needle_mode", pairs="recall_n", length="recall_length", gap="recall_gaps")
        for task in [needle] * bool(self.needle_n) + [recall] * bool(self.recall_n):
            try:
                task.validate()
            except ValueError as e:  # its keys are the task's: name ours
                key, _, why = str(e).partition("=")
                raise UserError(f"trainer.eval.{ours.get(key, key)}={why}" if why else f"trainer.eval: {e}") from None
        if self.on and not (self.ppl_data or self.needle_n or self.recall_n):
            _bad(
                "trainer.eval.every" if self.every else "trainer.eval.at_end",
                "in-loop evaluation is on but measures nothing: set "
                "trainer.eval.ppl_data=[<data config>], trainer.eval.needle_n=[1,2] and/or trainer.eval.recall_n=[2,4]",
            )


@dataclass
class SpikesConfig:
    """Loss and grad-norm spikes (`trainer.spikes`, diffllm/train/spikes.py): a step whose loss or global grad norm
    lies more than z_loss / z_grad sample standard deviations above the mean of the last `window` steps' values is a
    spike, once `warmup` values are in the window. log: counted and logged; skip: its update is dropped on every
    rank; stop: dropped, then the run saves and exits 7. max_consecutive_skips skipped spikes in a row: save, exit 7."""

    action: str = "log"  # log | skip | stop
    window: int = 128  # steps whose values the z-score is taken over (the step itself not among them)
    warmup: int = 64  # values the window must hold before it judges (>= 2)
    z_loss: float = 6.0  # loss spike: loss > mean + z_loss * std of the window (0: loss not tested)
    z_grad: float = 6.0  # grad-norm spike: the same with the pre-clip global grad norm (0: not tested)
    max_consecutive_skips: int = 5  # action=skip: this many skipped spikes in a row save and stop the run (exit 7)

    def validate(self) -> None:
        if self.action not in SPIKE_ACTIONS:
            _bad("trainer.spikes.action", f"got {self.action!r}, expected one of {SPIKE_ACTIONS}")
        if self.warmup < 2:
            _bad("trainer.spikes.warmup", f"must be >= 2 (a standard deviation needs two values), got {self.warmup}")
        if self.window < self.warmup:
            _bad("trainer.spikes.window", f"must be >= trainer.spikes.warmup={self.warmup}, got {self.window}")
        for key in ("z_loss", "z_grad"):
            if not getattr(self, key) >= 0:
                _bad(f"trainer.spikes.{key}", f"must be >= 0 (0: not tested), got {getattr(self, key)}")
        if self.max_consecutive_skips < 1:
            _bad("trainer.spikes.max_consecutive_skips", f"must be >= 1, got {self.max_consecutive_skips}")


@dataclass
class FaultsConfig:
    """Fault injection for tests (`trainer.faults`, diffllm/train/faults.py): the failures that the watchdog,
    non-finite, spike and signal tests need, made at chosen steps (counted from 1: the step being made)."""

    nan_at_steps: list = field(default_factory=list)  # rank 0's loss becomes NaN there
    stall_at_steps: list = operational(factory=list)  # rank 0 hangs reading data there
    step_delay_s: float = operational(0.0)  # rank 0 sleeps this long per step (a slow node; the numbers stay)
    loss_scale_at_steps: list = field(default_factory=list)  # every rank's loss (so its gradients) x loss_scale there
    loss_scale: float = 1000.0  # the factor of loss_scale_at_steps (a spike)

    @property
    def on(self) -> bool:
        return bool(self.stall_at_steps or self.step_delay_s or self.nan_at_steps or self.loss_scale_at_steps)

    def validate(self) -> None:
        if self.step_delay_s < 0:
            raise UserError(f"trainer.faults.step_delay_s: must be >= 0 seconds, got {self.step_delay_s}")


@dataclass
class TrainerConfig:
    tokens: Tokens = branch_free(524288)  # training budget; the run stops exactly here
    # round a budget that is not a whole number of steps up to one (with a note)
    round_tokens: bool = operational(False)
    global_batch_tokens: Tokens = 4096  # tokens per optimizer step, all ranks and micro-batches together
    micro_batch_size: int = branch_free(8)  # sequences per rank per forward/backward
    zero_stage: int = branch_free(2)  # DeepSpeed ZeRO stage 0-3
    offload_optimizer: bool = branch_free(False)  # ZeRO-1/2/3: optimizer state in CPU memory
    offload_params: bool = branch_free(False)  # ZeRO-3 only: parameters in CPU memory
    precision: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | fp32 | bf16
    activation_checkpointing: bool = operational(False)  # recompute each block in the backward pass
    compile: bool = operational(False)  # torch.compile the whole model and its loss (DeepSpeed's engine.compile())
    log_every: int = operational(8)  # steps between progress lines / metrics.jsonl records
    # what each logged step measures beside the loss (diffllm/train/diagnostics.py): off | cheap | full
    diagnostics: str = operational("full")
    val_every: int = branch_free(32)  # steps between validations (0: only at the start and the end)
    val_batches: int = branch_free(16)  # held-out batches per in-loop validation, spread over the held-out set
    # the held-out set: at most this many tokens of each held-out source, from its start (null: all of it); in-loop
    # validation spreads its batches over it, the final validation (summary.json's final_val_loss) scores it whole
    val_tokens: Optional[int] = branch_free(None)
    val_batch_size: Optional[int] = operational(None)  # None -> micro_batch_size
    save_every_steps: int = operational(32)  # 0: no step-based saves
    save_every_minutes: float = operational(10.0)  # 0: no time-based saves
    keep_last: int = operational(2)  # checkpoints kept in run_dir/checkpoints (older ones are deleted)
    # auto (latest in run_dir) | none (fresh; old run files moved aside) | <checkpoint path>
    resume: str = operational("auto")
    # resuming with another optimisation schedule (any optim key, trainer.tokens, trainer.global_batch_tokens) is
    # refused unless this is true (then each change is a note); a finished run may always train on to a larger budget
    allow_changes: bool = operational(False)
    # optim.schedule=wsd: keep a checkpoint where each budget's decay begins
    branch_budgets: list = operational(factory=list)
    # a WSD run directory: start this run (its own budget) from its branch checkpoint
    branch_from: Optional[str] = branch_free(None)
    max_nonfinite_in_a_row: int = branch_free(5)  # stop after this many consecutive skipped (non-finite) steps
    dist_timeout_minutes: float = operational(10.0)  # a collective waiting longer than this ends the job
    # no progress in a step phase (data, forward/backward, all-reduce, optimizer, validation) for this long: one line
    # naming the phase, thread stacks, exit code 5; 0 = off
    stall_timeout_s: float = operational(900.0)
    deepspeed: dict = field(default_factory=dict)  # raw DeepSpeed keys, merged over the generated config
    faults: FaultsConfig = field(default_factory=FaultsConfig)  # fault injection for tests (off by default)
    eval: EvalConfig = operational(factory=EvalConfig)  # in-loop evaluation (off by default)
    spikes: SpikesConfig = field(default_factory=SpikesConfig)  # loss / grad-norm spike detection (log by default)

    def __post_init__(self) -> None:
        from ..config import build

        for key, cls in (("eval", EvalConfig), ("spikes", SpikesConfig), ("faults", FaultsConfig)):
            if not isinstance(getattr(self, key), cls):  # a node: built and checked
                setattr(self, key, build(cls, getattr(self, key), f"trainer.{key}"))

    def validate(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            _bad("trainer.zero_stage", f"got {self.zero_stage}, expected 0, 1, 2 or 3")
        if self.precision not in PRECISIONS:
            _bad("trainer.precision", f"got {self.precision!r}, expected one of {PRECISIONS}")
        if self.diagnostics not in DIAGNOSTICS:
            _bad("trainer.diagnostics", f"got {self.diagnostics!r}, expected one of {DIAGNOSTICS}")
        if self.offload_params and self.zero_stage != 3:
            _bad("trainer.offload_params", "needs trainer.zero_stage=3")
        if self.offload_optimizer and self.zero_stage == 0:
            _bad("trainer.offload_optimizer", "needs trainer.zero_stage >= 1")
        for key in ("micro_batch_size", "log_every", "keep_last", "val_batches", "max_nonfinite_in_a_row"):
            if getattr(self, key) < 1:
                _bad(f"trainer.{key}", f"must be >= 1, got {getattr(self, key)}")
        if self.val_tokens is not None and self.val_tokens < 1:
            _bad("trainer.val_tokens", f"must be >= 1 (null: the whole held-out set), got {self.val_tokens}")
        for key in ("val_every", "save_every_steps", "save_every_minutes"):
            if getattr(self, key) < 0:
                _bad(f"trainer.{key}", f"must be >= 0, got {getattr(self, key)}")
        if self.branch_from is not None and self.resume not in ("auto", "none"):
            _bad(
                "trainer.branch_from",
                f"a branch starts from its parent's checkpoint, not trainer.resume={self.resume}: drop one of the two",
            )
        for i, b in enumerate(self.branch_budgets):
            parse_count(b, f"trainer.branch_budgets[{i}]")


@dataclass
class OptimConfig:
    name: str = "adamw"  # the optimizer; adamw (decoupled weight decay) is the one implemented
    lr: float = 3.2e-4  # peak learning rate
    min_lr: float = 1.28e-5  # floor reached at the last step (linear, cosine, wsd)
    betas: list = field(default_factory=lambda: [0.9, 0.95])  # AdamW (beta1, beta2)
    eps: float = 1e-6  # AdamW epsilon
    weight_decay: float = 0.1  # not applied to norms, biases and the Diff lambda_* parameters
    grad_clip: float = 1.0  # global-norm clipping (0: off)
    schedule: str = "linear"  # linear (the paper's) | cosine | wsd | constant
    warmup_steps: int = 1000  # linear warmup from lr/warmup_steps to lr
    decay_fraction: float = 0.2  # wsd only: the final fraction of steps that decays to min_lr

    def validate(self) -> None:
        if self.name != "adamw":
            _bad("optim.name", f"got {self.name!r}; only adamw is implemented")
        if self.schedule not in SCHEDULES:
            _bad("optim.schedule", f"got {self.schedule!r}, expected one of {SCHEDULES}")
        if not self.lr >= 0.0:  # a NaN too
            _bad("optim.lr", f"must be >= 0 (the peak learning rate), got {self.lr}")
        if not 0.0 <= self.min_lr <= self.lr:
            _bad("optim.min_lr", f"must lie in [0, optim.lr={self.lr}], got {self.min_lr}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            _bad("optim.betas", f"expected two values in [0, 1), got {self.betas}")
        for key in ("warmup_steps", "grad_clip", "weight_decay"):
            if getattr(self, key) < 0:
                _bad(f"optim.{key}", "must be >= 0")
        if not 0.0 <= self.decay_fraction <= 1.0:
            _bad("optim.decay_fraction", f"must lie in [0, 1], got {self.decay_fraction}")


@dataclass
class LoggingConfig:
    wandb: str = "auto"  # auto: online with a W&B key, else offline | online | offline | disabled
    project: str = "diffllm"  # W&B project
    entity: Optional[str] = None  # W&B team or user (null: the key's default)
    name: Optional[str] = None  # None -> the run_dir's name
    tags: list = field(default_factory=list)  # W&B run tags
    peak_tflops: Optional[float] = None  # override the per-device dense bf16 peak used for MFU
    online_timeout_s: float = 20.0  # W&B online start: give up and log offline after this long

    def validate(self) -> None:
        if self.wandb not in WANDB_MODES:
            raise UserError(f"logging.wandb: got {self.wandb!r}, expected one of {WANDB_MODES}")


@dataclass
class TrainKeys:
    """`diffllm train`'s keys beside its groups (model, data, trainer, optim, logging)."""

    seed: int = 1234  # model init (the data order has its own data.seed)
    run_dir: str = "runs/run"  # everything of a run: metrics.jsonl, summary.json, checkpoints/, wandb/


def train_schema() -> dict[str, type]:
    """The typed configs of configs/train.yaml: {group ("" = root keys): dataclass}."""
    from ..data import DataConfig
    from ..model import ModelConfig

    groups = {"model": ModelConfig, "data": DataConfig, "trainer": TrainerConfig, "optim": OptimConfig}
    return {**groups, "logging": LoggingConfig, "": TrainKeys}


@dataclass(frozen=True)
class TrainConfig:
    """Everything `diffllm train` is given, typed: what the Trainer takes (from the typed configs a launch built once,
    from_typed, or from a composed config, from_hydra); checked together whenever one is made (replace included).
    Frozen: what a launch changes (resume.py's plan: the tokenizer's vocabulary, model.init_from's architecture) is a
    new TrainConfig (dataclasses.replace), and `resolved`, the config that checkpoints and config.yaml record, is
    derived from it, so the two cannot disagree."""

    trainer: TrainerConfig
    optim: OptimConfig
    logging: LoggingConfig = operational()
    model: ModelConfig
    data: DataConfig
    seed: int = 1234
    run_dir: str = operational("runs/run")

    @property
    def resolved(self) -> dict:
        """The whole resolved config as plain containers (checkpoints, config.yaml, W&B), from the typed configs."""
        groups = {name: asdict(getattr(self, name)) for name in ("model", "data", "trainer", "optim", "logging")}
        return {**groups, "seed": self.seed, "run_dir": self.run_dir}

    @classmethod
    def from_typed(cls, typed: dict[str, Any]) -> TrainConfig:
        """From train_schema()'s dataclasses, built and checked (diffllm.config.check_typed: what @hydra_app gives)."""
        keys = typed[""]
        return cls(**{g: c for g, c in typed.items() if g}, seed=keys.seed, run_dir=keys.run_dir)

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> TrainConfig:
        """Each group built and validated into its dataclass (a bad key or value is a one-line ValueError)."""
        from ..config import check_typed

        return cls.from_typed(check_typed(cfg, train_schema()))

    def __post_init__(self) -> None:
        self.check_together()

    def check_together(self) -> None:
        """What no group can check alone: the training windows fit the model's context."""
        if self.data.seq_len > self.model.max_seq_len:
            raise UserError(
                f"data.seq_len={self.data.seq_len}: longer than model.max_seq_len={self.model.max_seq_len} (the "
                f"model's context); use data.seq_len <= {self.model.max_seq_len}, or set model.max_seq_len"
            )
