"""The command registry: one entry per `diffllm` command (its entry function, config, typed configs, one-line summary
and examples), as plain data at the bottom of the package: the dispatcher (cli.py), the Hydra apps (apps.py), the
help text (help.py) and the commands themselves read it without importing one another."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Optional

MODEL = "diffllm.model.config:ModelConfig"
DATA = "diffllm.data.config:DataConfig"
TRAIN = {"model": MODEL, "data": DATA, "trainer": "diffllm.train.config:TrainerConfig",
         "optim": "diffllm.train.config:OptimConfig", "logging": "diffllm.train.config:LoggingConfig"}


@dataclass(frozen=True)
class Command:
    """One command. A new one is one entry in _REGISTRY; a Hydra command's configs/<config>.yaml lists
    `- <config>_schema` first in its defaults (the schema's dataclass defaults, under the YAML)."""

    entry: str  # "module:function": a Hydra app (hydra_app) or a function that parses its own argv
    summary: str  # the one line in `diffllm --help`
    config: Optional[str] = None  # configs/<config>.yaml; None: the command parses its own argv (--help goes to it)
    schema: dict[str, str] = field(default_factory=dict)  # group ("" = root keys) -> "module:Dataclass"
    examples: tuple[str, ...] = ()
    name: str = ""


_REGISTRY: dict[str, Command] = {
    "info": Command(
        "diffllm.info:main", "parameters, training FLOPs per token and weight memory of a model preset", "info",
        {"model": MODEL},
        ("diffllm info model=diff-3b", "diffllm info model=transformer-830m seq_len=4096", "diffllm info all=true")),
    "tokenizer train": Command(
        "diffllm.data.commands:train_main", "train the byte-level BPE tokenizer on a data config's sources",
        "tokenizer", {"data": DATA},
        ("diffllm tokenizer train", "diffllm tokenizer train data.tokenizer.vocab_size=1024 out=tok/tokenizer.json",
         "diffllm tokenizer train data=mine   # ./configs/data/mine.yaml")),
    "data prepare": Command(
        "diffllm.data.commands:prepare_main", "pre-tokenize a data config into shards for data.prepared_dir",
        "data_prepare", {"data": DATA},
        ("diffllm data prepare", "diffllm data prepare data=mine out=prepared/mine workers=2",
         "diffllm train data.prepared_dir=prepared/shakespeare   # then train from the shards")),
    "train": Command(
        "diffllm.train.app:main", "train a model (DeepSpeed ZeRO); relaunching resumes from run_dir", "train", TRAIN,
        ("diffllm train", "diffllm train model=transformer-tiny trainer.tokens=1M run_dir=runs/t-tiny",
         "diffllm train model.lambda_init=0.5 model.attn_backend=eager data.seq_len=128")),
    "plan": Command(
        "diffllm.scaling.planner:main", "memory per GPU under ZeRO 0-3, the largest micro-batch, time to a budget",
        "plan", {"model": MODEL, "": "diffllm.scaling.planner:PlanConfig"},
        ("diffllm plan model=diff-3b nodes=2 gpus_per_node=8 gpu=h100 tokens=1T", "diffllm plan gpus=true",
         "diffllm plan model=diff-13.1b zero_stage=3 activation_checkpointing=true")),
    "launch": Command(
        "diffllm.launch.cli:main", "run `diffllm train` under torchrun, deepspeed or SLURM (argparse options)",
        examples=("diffllm launch --procs 8 model=diff-3b", "diffllm launch --launcher slurm --nodes 4 --dry-run")),
    "sweep": Command(
        "diffllm.sweep.cli:main", "run a grid of training runs (presets x budgets x hyperparameter axes x seeds) through Hydra multirun",
        "sweep", {"sweep": "diffllm.sweep.grid:SweepConfig"},
        ("diffllm sweep dry_run=true", "diffllm sweep sweep=paper launcher=submitit_slurm",
         "diffllm sweep --config-dir my_configs sweep=mine   # my_configs/sweep/mine.yaml, also seen by the jobs")),
    "sweep collect": Command(
        "diffllm.sweep.cli:collect_main", "tabulate a sweep's run summaries into runs.csv and runs.md", "sweep",
        {"sweep": "diffllm.sweep.grid:SweepConfig"},
        ("diffllm sweep collect", "diffllm sweep collect sweep_dir=runs/sweep/paper out=reports")),
    "scaling fit": Command(
        "diffllm.scaling.report:main", "fit scaling laws to a collected sweep: ratios at equal loss, plots",
        "scaling", {"": "diffllm.scaling.report:ScalingConfig"},
        ("diffllm scaling fit sweep_dir=runs/sweep/micro", "diffllm scaling fit params=total joint=none reps=100")),
    "generate": Command(
        "diffllm.eval.generate:main", "continue a prompt with a trained model (KV cache; greedy or sampled)",
        examples=('diffllm generate run=runs/diff-tiny prompt="ROMEO:" max_new_tokens=60',
                  'diffllm generate run=runs/diff-tiny prompt="ROMEO:" temperature=0.8 top_k=50 seed=1 stop=["\\n\\n"]')),
    "eval ppl": Command(
        "diffllm.eval.ppl:main", "loss, perplexity and bits per byte of a run, per held-out source",
        examples=("diffllm eval ppl run=runs/diff-tiny", "diffllm eval ppl run=runs/diff-tiny data=my_texts/*.txt")),
    "eval needle": Command(
        "diffllm.eval.needle:main", "multi-needle retrieval: accuracy by needles x depth x length, heatmap",
        examples=("diffllm eval needle run=runs/diff-tiny mode=synthetic",
                  "diffllm eval needle run=runs/diff-tiny mode=text lengths=[256,512]")),
    "eval attention": Command(
        "diffllm.eval.attention:main", "attention mass on the answer needle vs the rest of the context, per layer",
        examples=("diffllm eval attention run=runs/diff-tiny",)),
    "eval outliers": Command(
        "diffllm.eval.outliers:main", "top-k activation and attention-logit magnitudes; loss with quantised logits",
        examples=("diffllm eval outliers run=runs/diff-tiny",)),
    "eval lm-eval": Command(
        "diffllm.eval.harness:main", "lm-evaluation-harness tasks through the native adapter (offline, local tasks)",
        examples=("diffllm eval lm-eval run=runs/diff-tiny tasks=[plays_cloze]",)),
    "eval compare": Command(
        "diffllm.eval.compare:main", "one table (and plots) of every eval result for several runs",
        examples=("diffllm eval compare runs=[runs/diff-tiny,runs/transformer-tiny]",)),
    "export": Command(
        "diffllm.export.commands:export_main", "write a run's checkpoint as a Hugging Face model directory", "export",
        examples=("diffllm export run=runs/diff-tiny out=hf/diff-tiny",
                  "diffllm export run=runs/diff-tiny step=64 out=hf/diff-tiny-64 format=remote dtype=bfloat16")),
    "import": Command(
        "diffllm.export.commands:import_main", "turn a Hugging Face model directory into a run at step 0", "import",
        examples=("diffllm import hf/stablelm-3b-4e1t out=runs/stablelm-cont",
                  "diffllm train model.init_from=runs/stablelm-cont run_dir=runs/stablelm-cont-1   # then train on")),
}
COMMANDS: dict[str, Command] = {name: Command(**{**c.__dict__, "name": name}) for name, c in _REGISTRY.items()}


def command_for_config(config_name: str) -> Optional[Command]:
    return next((c for c in COMMANDS.values() if c.config == config_name), None)


def load(target: str) -> Any:
    """"module:attr" -> the object."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)
