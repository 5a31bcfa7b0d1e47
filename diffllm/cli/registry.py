"""The command registry: one entry per `diffllm` command, a table of "module:name" strings (its entry function, its
typed configs), its config file, a one-line summary and examples. A command's module is imported only when it runs,
so `diffllm --help` stays light; follow an entry's string to find the command (`diffllm train` -> diffllm/train/app.py
`main`). Each command's module declares its own typed configs (its `@hydra_app`); the entry names them too, so that
--help and a config composed by name (diffllm.config.compose) find them without running the command."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Optional

from ..config import declare


@dataclass(frozen=True)
class Command:
    """One command. A new one is one entry in COMMANDS. A `key=value` command names its typed configs in `schema`:
    with a `config`, Hydra composes configs/<config>.yaml (which lists `- <config>_schema` first in its defaults: every
    field at its dataclass default) over them; without one, its arguments are the schema's root dataclass alone
    (diffllm.config.run_key_values). No schema: the command parses its own argv (launch's flags; --help goes to it)."""

    entry: str  # "module:function", the command's main(): config.hydra_app, config.run_key_values or its own parser
    summary: str  # the one line in `diffllm --help`
    config: Optional[str] = None  # configs/<config>.yaml
    schema: str = ""  # "module:NAME": a {group ("" = root keys): dataclass} dict, or the root dataclass alone
    examples: tuple[str, ...] = ()


COMMANDS: dict[str, Command] = {
    "info": Command(
        "diffllm.model.info:main",
        "parameters, training FLOPs per token and weight memory of a model preset",
        config="info",
        schema="diffllm.model.info:SCHEMA",
        examples=(
            "diffllm info model=diff-3b",
            "diffllm info model=transformer-830m seq_len=4096",
            "diffllm info all=true",
        ),
    ),
    "tokenizer train": Command(
        "diffllm.data.commands:train_main",
        "train the byte-level BPE tokenizer on a data config's sources",
        config="tokenizer",
        schema="diffllm.data.commands:TOKENIZER",
        examples=(
            "diffllm tokenizer train",
            "diffllm tokenizer train data.tokenizer.vocab_size=1024 out=tok/tokenizer.json",
            "diffllm tokenizer train data=mine   # ./configs/data/mine.yaml",
        ),
    ),
    "data prepare": Command(
        "diffllm.data.commands:prepare_main",
        "pre-tokenize a data config into shards for data.prepared_dir",
        config="data_prepare",
        schema="diffllm.data.commands:PREPARE",
        examples=(
            "diffllm data prepare",
            "diffllm data prepare data=mine out=prepared/mine workers=2",
            "diffllm train data.prepared_dir=prepared/shakespeare   # then train from the shards",
        ),
    ),
    "train": Command(
        "diffllm.train.app:main",
        "train a model (DeepSpeed ZeRO); relaunching resumes from run_dir",
        config="train",
        schema="diffllm.train.app:SCHEMA",
        examples=(
            "diffllm train",
            "diffllm train model=transformer-tiny trainer.tokens=1M run_dir=runs/t-tiny",
            "diffllm train model.lambda_init=0.5 model.attn_backend=eager data.seq_len=128",
        ),
    ),
    "plan": Command(
        "diffllm.scaling.planner:main",
        "memory per GPU under ZeRO 0-3, the largest micro-batch, time to a budget",
        config="plan",
        schema="diffllm.scaling.config:PLAN",
        examples=(
            "diffllm plan model=diff-3b nodes=2 gpus_per_node=8 gpu=h100 tokens=1T",
            "diffllm plan gpus=true",
            "diffllm plan model=diff-13.1b zero_stage=3 activation_checkpointing=true",
        ),
    ),
    "launch": Command(
        "diffllm.launch.cli:main",
        "run `diffllm train` under torchrun, deepspeed or SLURM (argparse options)",
        examples=("diffllm launch --procs 8 model=diff-3b", "diffllm launch --launcher slurm --nodes 4 --dry-run"),
    ),
    "sweep": Command(
        "diffllm.sweep.cli:main",
        "run a grid of training runs (presets x budgets x hyperparameter axes x seeds) through Hydra multirun",
        config="sweep",
        schema="diffllm.sweep.cli:SCHEMA",
        examples=(
            "diffllm sweep dry_run=true",
            "diffllm sweep sweep=paper launcher=submitit_slurm",
            "diffllm sweep --config-dir my_configs sweep=mine   # my_configs/sweep/mine.yaml, also seen by the jobs",
        ),
    ),
    "sweep collect": Command(
        "diffllm.sweep.cli:collect_main",
        "tabulate a sweep's run summaries into runs.csv and runs.md",
        config="sweep",
        schema="diffllm.sweep.cli:SCHEMA",
        examples=("diffllm sweep collect", "diffllm sweep collect sweep_dir=runs/sweep/paper out=reports"),
    ),
    "scaling fit": Command(
        "diffllm.scaling.report:main",
        "fit scaling laws to a collected sweep: ratios at equal loss, plots",
        config="scaling",
        schema="diffllm.scaling.config:ScalingConfig",
        examples=(
            "diffllm scaling fit sweep_dir=runs/sweep/micro",
            "diffllm scaling fit params=total joint=none reps=100",
        ),
    ),
    "scaling coord-check": Command(
        "diffllm.scaling.coord_check:main",
        "mean |activation| per layer after a few steps at 5+ widths: flat if a parametrization transfers",
        config="coord_check",
        schema="diffllm.scaling.config:COORD_CHECK",
        examples=(
            "diffllm scaling coord-check model=diff-tiny model.parametrization=mup",
            "diffllm scaling coord-check model=transformer-tiny widths=[16,32,64,128,256] steps=4 out=cc/sp",
        ),
    ),
    "generate": Command(
        "diffllm.eval.generate:main",
        "continue a prompt with a trained model (KV cache; greedy or sampled)",
        schema="diffllm.eval.generate:GenerateConfig",
        examples=(
            'diffllm generate run=runs/diff-tiny prompt="ROMEO:" max_new_tokens=60',
            'diffllm generate run=runs/diff-tiny prompt="ROMEO:" temperature=0.8 top_k=50 seed=1 stop=["\\n\\n"]',
        ),
    ),
    "eval ppl": Command(
        "diffllm.eval.ppl:main",
        "loss, perplexity and bits per byte of a run, per held-out source",
        schema="diffllm.eval.config:PplConfig",
        examples=("diffllm eval ppl run=runs/diff-tiny", "diffllm eval ppl run=runs/diff-tiny data=my_texts/*.txt"),
    ),
    "eval needle": Command(
        "diffllm.eval.needle:main",
        "multi-needle retrieval: accuracy by needles x depth x length, heatmap",
        schema="diffllm.eval.config:NeedleConfig",
        examples=(
            "diffllm eval needle run=runs/diff-tiny mode=synthetic",
            "diffllm eval needle run=runs/diff-tiny mode=text lengths=[256,512]",
        ),
    ),
    "eval recall": Command(
        "diffllm.eval.recall:main",
        "associative recall on held-out key-value sets: accuracy by N x gap x length, bootstrap intervals",
        schema="diffllm.eval.config:RecallConfig",
        examples=(
            "diffllm eval recall run=runs/recall-tiny",
            "diffllm eval recall run=runs/recall-tiny n=[2,4,8] gaps=[0,16,32] lengths=[64,128] trials=64",
        ),
    ),
    "eval attention": Command(
        "diffllm.eval.attention:main",
        "attention mass on the answer (needle, or recall pair) vs the rest of the context, per layer",
        schema="diffllm.eval.config:AttentionConfig",
        examples=(
            "diffllm eval attention run=runs/diff-tiny",
            "diffllm eval attention run=runs/diff-recall task=recall n=[2,4,8] gaps=[0,16] length=64 trials=32",
        ),
    ),
    "eval outliers": Command(
        "diffllm.eval.outliers:main",
        "top-k activation and attention-logit magnitudes; loss with quantised logits",
        schema="diffllm.eval.config:OutliersConfig",
        examples=("diffllm eval outliers run=runs/diff-tiny",),
    ),
    "eval lm-eval": Command(
        "diffllm.eval.harness:main",
        "lm-evaluation-harness tasks through the native adapter (offline, local tasks)",
        schema="diffllm.eval.harness:LmEvalConfig",
        examples=("diffllm eval lm-eval run=runs/diff-tiny tasks=[plays_cloze]",),
    ),
    "eval icl": Command(
        "diffllm.eval.icl:main",
        "many-shot in-context classification: accuracy by k, spread over demonstration orders",
        schema="diffllm.eval.icl:IclConfig",
        examples=(
            "diffllm eval icl run=runs/diff-tiny task=synthetic k=[0,1,4,16] permutations=5",
            "diffllm eval icl run=runs/diff-tiny task=trec/ label_field=coarse_label k=[0,4,max] permutations=10",
        ),
    ),
    "eval compare": Command(
        "diffllm.eval.compare:main",
        "one table (and plots) of every eval result for several runs",
        schema="diffllm.eval.compare:CompareConfig",
        examples=("diffllm eval compare runs=[runs/diff-tiny,runs/transformer-tiny]",),
    ),
    "study attention": Command(
        "diffllm.studies.attention:main",
        "the attention family at equal size: val loss, recall accuracy and KV cache per token against MHA",
        schema="diffllm.studies.attention:Config",
        examples=(
            "diffllm study attention lm=results/micro-attention/lm/runs.csv "
            "recall=results/micro-attention/recall/runs.csv out=results/micro-attention",
        ),
    ),
    "study claims": Command(
        "diffllm.studies.claims:main",
        "eval ppl by_position and eval icl on a sweep's selected runs: NLL by position, ICL by k, order spread",
        schema="diffllm.studies.claims:Config",
        examples=("diffllm study claims sweep_dir=results/micro-claims/runs/runs.csv out=results/micro-claims",),
    ),
    "study compare": Command(
        "diffllm.studies.compare:main",
        "two collected sweeps on the points both trained: paired differences, spreads, rankings",
        schema="diffllm.studies.compare:Config",
        examples=("diffllm study compare a=results/micro-branch/runs.csv b=results/micro-branch/control/runs.csv",),
    ),
    "study needle": Command(
        "diffllm.studies.needle:main",
        "eval needle on a sweep's selected runs: accuracy by number of needles (needle.md)",
        schema="diffllm.studies.needle:Config",
        examples=("diffllm study needle sweep_dir=runs/sweep/micro",),
    ),
    "study outliers": Command(
        "diffllm.studies.outliers:main",
        "eval outliers on a sweep's selected runs: top-1 logit and hidden state, loss and accuracy by logit bits",
        schema="diffllm.studies.outliers:Config",
        examples=("diffllm study outliers sweep_dir=runs/sweep/micro-branch out=results/micro-outliers",),
    ),
    "study recall": Command(
        "diffllm.studies.recall:main",
        "the retrieval study: recall accuracy, steps to a level, attention probe",
        schema="diffllm.studies.recall:Config",
        examples=("diffllm study recall sweep_dir=runs/sweep/micro-recall out=results/micro-retrieval",),
    ),
    "study stability": Command(
        "diffllm.studies.stability:main",
        "a learning-rate stability sweep: divergences, spikes, grad norms, outliers, lambda",
        schema="diffllm.studies.stability:Config",
        examples=("diffllm study stability sweep_dir=results/micro-stability/runs/runs.csv",),
    ),
    "study transfer": Command(
        "diffllm.studies.transfer:main",
        "lr transfer across width: each width's best lr from a quadratic over seeds, its shift per doubling, sp vs mup",
        schema="diffllm.studies.transfer:Config",
        examples=("diffllm study transfer sweep_dir=results/micro-transfer/runs.csv out=results/micro-transfer",),
    ),
    "runs": Command(
        "diffllm.overview:main",
        "one line per run below a folder: model, arch, tokens of budget, status, last val loss, last checkpoint",
        schema="diffllm.overview:RunsConfig",
        examples=("diffllm runs", "diffllm runs runs/sweep/micro"),
    ),
    "export": Command(
        "diffllm.export.commands:export_main",
        "write a run's checkpoint as a Hugging Face model directory",
        config="export",
        schema="diffllm.export.commands:ExportConfig",
        examples=(
            "diffllm export run=runs/diff-tiny out=hf/diff-tiny",
            "diffllm export run=runs/diff-tiny step=64 out=hf/diff-tiny-64 format=remote dtype=bfloat16",
        ),
    ),
    "import": Command(
        "diffllm.export.commands:import_main",
        "turn a Hugging Face model directory into a run at step 0",
        config="import",
        schema="diffllm.export.commands:ImportConfig",
        examples=(
            "diffllm import hf/stablelm-3b-4e1t out=runs/stablelm-cont",
            "diffllm train model.init_from=runs/stablelm-cont run_dir=runs/stablelm-cont-1   # then train on",
        ),
    ),
}


def load(target: str) -> Any:
    """ "module:name" -> the object (the module imported now)."""
    module, _, attr = target.partition(":")
    return getattr(import_module(module), attr)


def schema(target: str) -> dict[str, type]:
    """The typed configs a Command.schema names, {group ("" = root keys): dataclass}: a dict, or a root dataclass."""
    found = load(target)
    return found if isinstance(found, dict) else {"": found}


for _name, _cmd in COMMANDS.items():  # composing a config or a command's arguments finds its typed configs by name
    for _key in {_name, _cmd.config or _name} if _cmd.schema else ():
        declare(_key, functools.partial(schema, _cmd.schema))
