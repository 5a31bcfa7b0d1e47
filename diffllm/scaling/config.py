"""The typed configs of the scaling commands: `diffllm plan` (PlanConfig), `diffllm scaling fit` (ScalingConfig) and
`diffllm scaling coord-check` (CoordCheckConfig).
Plain dataclasses that import nothing heavy, so that composing their configs and `--help` stay light."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..counts import parse_count
from ..errors import UserError
from ..model.config import ModelConfig

DEFAULT_SELECT = "optim.lr"  # the axis best-of-grid selection chooses over, where runs differ in it
DEFAULT_SELECT_BY = "final_val_loss"  # ... and the metric it chooses by (scaling/select.py SELECT_BY)


@dataclass
class PlanConfig:
    seq_len: Optional[int] = None  # None -> the preset's max_seq_len
    global_batch_tokens: str = "4194304"  # tokens per optimizer step, all ranks together
    tokens: str = "100B"  # the training budget
    nodes: int = 1  # machines
    gpus_per_node: int = 8  # GPUs per machine (ranks per node)
    gpu: str = "h100"  # the GPU type whose memory and peak bf16 FLOPs are used (plan gpus=true lists them)
    mfu: float = 0.40  # model FLOPs utilisation assumed for the time estimate
    zero_stage: Optional[int] = None  # None -> rows for 0, 1, 2, 3
    activation_checkpointing: Optional[bool] = None  # None -> rows with and without
    offload: Optional[bool] = None  # None -> rows with and without (optimizer, and for ZeRO-3 also params, to CPU)
    micro_batch_size: Optional[int] = None  # None -> the largest that fits
    diagnostics: str = "full"  # trainer.diagnostics: off | cheap | full (full adds its logged-step transients)
    # raw DeepSpeed keys as trainer.deepspeed takes them: its zero_optimization keys override the knobs counted
    deepspeed: dict = field(default_factory=dict)
    usable_fraction: float = 0.90  # of GPU memory; the rest for the CUDA context, NCCL buffers, fragmentation
    # inference: bf16 weights + the KV cache of `batch` sequences of `context` tokens (the variant's KV bytes/token)
    context: Optional[int] = None  # None -> seq_len
    batch: int = 1

    def validate(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise UserError(f"nodes={self.nodes}, gpus_per_node={self.gpus_per_node}: need at least one GPU")
        if not 0 < self.mfu <= 1:
            raise UserError(f"mfu={self.mfu}: must be in (0, 1]")
        if self.zero_stage not in (None, 0, 1, 2, 3):
            raise UserError(f"zero_stage={self.zero_stage}: must be 0, 1, 2 or 3")
        if self.diagnostics not in ("off", "cheap", "full"):
            raise UserError(f"diagnostics={self.diagnostics}: must be off, cheap or full")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise UserError(f"micro_batch_size={self.micro_batch_size}: must be >= 1 (null: the largest that fits)")
        if self.batch < 1 or (self.context is not None and self.context < 1):
            raise UserError(f"context={self.context}, batch={self.batch}: need at least one token and one sequence")


@dataclass
class ScalingConfig:
    sweep_dir: str = "runs/sweep/micro"  # a collected sweep folder, or its runs.csv
    add_runs: list[str] = field(default_factory=list)  # more runs.csv files or sweep folders joining sweep_dir's runs
    out: Optional[str] = None  # null: <sweep_dir>/scaling
    params: str = "block"  # N: block (non-embedding, without the output head: Kaplan) | nonembedding | total
    loss: str = "final_val_loss"  # final_val_loss | final_train_loss
    tokens: Optional[int] = None  # the budget L(N) is fitted at (null: the one that covers the most sizes)
    joint: str = "auto"  # auto | final | curves | none: where L(N, D) gets its points
    curve_min_fraction: float = 0.25  # learning-curve points before this fraction of the budget are left out
    reps: int = 400  # bootstrap replicates for L(N); a quarter of it for L(N, D)
    level: float = 0.9  # interval coverage
    seed: int = 0  # of the bootstrap
    title: str = "diffllm scaling"  # the report's and plots' title
    select: Optional[str] = DEFAULT_SELECT  # the axis chosen per (series, size, budget) (null: none; every run fits)
    select_protocol: str = "auto"  # auto | split | quadratic | same (diffllm/scaling/protocol.py)
    select_seeds: Optional[list[int]] = None  # split: the seeds the value is chosen on (null: the smallest seed)
    report_seeds: Optional[list[int]] = None  # split: the seeds reported (null: every other seed)
    exclude_undertrained: bool = False  # leave runs that do not beat the bigram out of the fits (fits.md: both ways)
    holdout: Optional[str] = None  # a preset size (micro-4) or a budget (3072000): fitted without, then predicted
    predict: Optional[str] = None  # <size>@<tokens>: each series' L(N, D) at its <arch>-<size> preset, before it runs
    # a gap (prediction, compute multiplier) from a fit that is not identified is refused; false: reported, flagged
    # (to score a prediction committed before this rule)
    refuse_unidentified: bool = True
    compute_ref: Optional[float] = None  # FLOPs the compute-optimal table is read at (null: the baseline's largest run)
    compute_grid: int = 5  # values of C, from the smallest to the largest run's compute, the frontier is tabulated at

    def validate(self) -> None:
        if self.params not in ("block", "nonembedding", "total"):
            raise UserError(f"params={self.params}: expected block, nonembedding or total")
        if self.loss not in ("final_val_loss", "final_train_loss"):
            raise UserError(f"loss={self.loss}: expected final_val_loss or final_train_loss")
        if self.joint not in ("auto", "final", "curves", "none"):
            raise UserError(f"joint={self.joint}: expected auto, final, curves or none")
        if self.compute_ref is not None and not self.compute_ref > 0:
            raise UserError(f"compute_ref={self.compute_ref}: must be a positive number of FLOPs (or null)")
        from .protocol import check_protocol

        if self.predict is not None:
            parse_predict(self.predict)

        check_protocol(self.select_protocol, self.select_seeds, self.report_seeds)
        if self.compute_grid < 2:
            raise UserError(f"compute_grid={self.compute_grid}: need at least 2 values of C for the exponents")


def parse_predict(spec: str) -> tuple[str, int]:
    """`predict=micro-6@6.8M` -> ("micro-6", 6800000); anything else is a one-line error."""
    size, at, tokens = str(spec).partition("@")
    if not (size and at and tokens):
        raise UserError(f"predict={spec}: expected <size>@<tokens>, e.g. predict=micro-6@6.8M")
    return size, parse_count(tokens, f"predict={spec}")


@dataclass
class CoordCheckConfig:
    """`diffllm scaling coord-check`'s own keys (the model group is the ModelConfig it varies in width)."""

    widths: list = field(default_factory=lambda: [16, 32, 64, 128, 256])  # d_model values, >= 2, increasing
    # n_layers values (>= 2, increasing): set, the check varies depth at the model's own width instead (completep:
    # base depth the smallest), recording the block that ends the first half and the last block
    depths: list = field(default_factory=list)
    head_dim: int = 8  # the head dim at every width (n_heads = width / head_dim)
    steps: int = 4  # AdamW steps at each width (values recorded before each step and after the last)
    lr: float = 0.01  # the (base) learning rate, constant
    weight_decay: float = 0.0  # AdamW weight decay (mup: a hidden matrix's is scaled with its lr)
    batch_size: int = 8  # sequences per step (the same batch every step)
    seq_len: int = 64  # tokens per sequence
    seed: int = 0  # the model init and the batch
    out: str = "coord-check"  # folder of coord_check.json and coord_check.png


PLAN = {"model": ModelConfig, "": PlanConfig}  # the typed configs of configs/plan.yaml
COORD_CHECK = {"model": ModelConfig, "": CoordCheckConfig}  # ... and of configs/coord_check.yaml
