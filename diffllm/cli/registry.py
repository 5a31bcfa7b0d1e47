"""The command registry: one entry per `diffllm` command (its entry function, its typed configs, its config file, a
one-line summary and examples). Each entry imports its command's module only when that command runs, so `diffllm
--help` stays light; follow an entry's import to find the command (`diffllm train` -> `_train` ->
diffllm/train/app.py `main`). An entry's `schema` is the one place its typed configs are named: diffllm.config reads it
from here by the config's or the command's name (composing, checking and --help)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

Entry = Callable[[], Callable[[], None]]


@dataclass(frozen=True)
class Command:
    """One command. A new one is one entry in _REGISTRY. A `key=value` command names its typed configs in `schema`:
    with a `config`, Hydra composes configs/<config>.yaml (which lists `- <config>_schema` first in its defaults: every
    field at its dataclass default) over them; without one, its arguments are the schema's root dataclass alone
    (diffllm.config.run_key_values). No schema: the command parses its own argv (launch's flags; --help goes to it)."""

    entry: Entry  # returns the command's main(): config.hydra_app, config.run_key_values, or a parser of its own argv
    summary: str  # the one line in `diffllm --help`
    config: Optional[str] = None  # configs/<config>.yaml
    schema: dict[str, str] = field(default_factory=dict)  # group ("" = root keys) -> "module:Dataclass"
    examples: tuple[str, ...] = ()
    name: str = ""


# ------------------------------------------------------------------------ typed configs ("module:Dataclass", unloaded)
_MODEL = {"model": "diffllm.model.config:ModelConfig"}
_DATA = {"data": "diffllm.data.config:DataConfig"}
_TRAIN = {
    **_MODEL,
    **_DATA,
    "trainer": "diffllm.train.config:TrainerConfig",
    "optim": "diffllm.train.config:OptimConfig",
    "logging": "diffllm.train.config:LoggingConfig",
    "": "diffllm.train.app:TrainKeys",
}
_SWEEP = {"sweep": "diffllm.sweep.grid:SweepConfig", "": "diffllm.sweep.cli:SweepCommandConfig"}


def _root(target: str) -> dict[str, str]:
    return {"": target}


# ------------------------------------------------------------------------------ entries: import only when run
def _info():
    from ..model.info import main

    return main


def _tokenizer_train():
    from ..data.commands import train_main

    return train_main


def _data_prepare():
    from ..data.commands import prepare_main

    return prepare_main


def _train():
    from ..train.app import main

    return main


def _plan():
    from ..scaling.planner import main

    return main


def _launch():
    from ..launch.cli import main

    return main


def _sweep():
    from ..sweep.cli import main

    return main


def _sweep_collect():
    from ..sweep.cli import collect_main

    return collect_main


def _scaling_fit():
    from ..scaling.report import main

    return main


def _coord_check():
    from ..scaling.coord_check import main

    return main


def _generate():
    from ..eval.generate import main

    return main


def _eval_ppl():
    from ..eval.ppl import main

    return main


def _eval_needle():
    from ..eval.needle import main

    return main


def _eval_recall():
    from ..eval.recall import main

    return main


def _eval_attention():
    from ..eval.attention import main

    return main


def _eval_outliers():
    from ..eval.outliers import main

    return main


def _eval_lm_eval():
    from ..eval.harness import main

    return main


def _eval_icl():
    from ..eval.icl import main

    return main


def _eval_compare():
    from ..eval.compare import main

    return main


def _study(name: str) -> Entry:
    def entry():
        from importlib import import_module

        return import_module(f"diffllm.studies.{name}").main

    return entry


def _runs():
    from ..overview import main

    return main


def _export():
    from ..export.commands import export_main

    return export_main


def _import():
    from ..export.commands import import_main

    return import_main


_REGISTRY: dict[str, Command] = {
    "info": Command(
        _info,
        "parameters, training FLOPs per token and weight memory of a model preset",
        config="info",
        schema={**_MODEL, **_root("diffllm.model.info:InfoConfig")},
        examples=(
            "diffllm info model=diff-3b",
            "diffllm info model=transformer-830m seq_len=4096",
            "diffllm info all=true",
        ),
    ),
    "tokenizer train": Command(
        _tokenizer_train,
        "train the byte-level BPE tokenizer on a data config's sources",
        config="tokenizer",
        schema={**_DATA, **_root("diffllm.data.commands:TokenizerTrainConfig")},
        examples=(
            "diffllm tokenizer train",
            "diffllm tokenizer train data.tokenizer.vocab_size=1024 out=tok/tokenizer.json",
            "diffllm tokenizer train data=mine   # ./configs/data/mine.yaml",
        ),
    ),
    "data prepare": Command(
        _data_prepare,
        "pre-tokenize a data config into shards for data.prepared_dir",
        config="data_prepare",
        schema={**_DATA, **_root("diffllm.data.commands:PrepareConfig")},
        examples=(
            "diffllm data prepare",
            "diffllm data prepare data=mine out=prepared/mine workers=2",
            "diffllm train data.prepared_dir=prepared/shakespeare   # then train from the shards",
        ),
    ),
    "train": Command(
        _train,
        "train a model (DeepSpeed ZeRO); relaunching resumes from run_dir",
        config="train",
        schema=_TRAIN,
        examples=(
            "diffllm train",
            "diffllm train model=transformer-tiny trainer.tokens=1M run_dir=runs/t-tiny",
            "diffllm train model.lambda_init=0.5 model.attn_backend=eager data.seq_len=128",
        ),
    ),
    "plan": Command(
        _plan,
        "memory per GPU under ZeRO 0-3, the largest micro-batch, time to a budget",
        config="plan",
        schema={**_MODEL, **_root("diffllm.scaling.config:PlanConfig")},
        examples=(
            "diffllm plan model=diff-3b nodes=2 gpus_per_node=8 gpu=h100 tokens=1T",
            "diffllm plan gpus=true",
            "diffllm plan model=diff-13.1b zero_stage=3 activation_checkpointing=true",
        ),
    ),
    "launch": Command(
        _launch,
        "run `diffllm train` under torchrun, deepspeed or SLURM (argparse options)",
        examples=("diffllm launch --procs 8 model=diff-3b", "diffllm launch --launcher slurm --nodes 4 --dry-run"),
    ),
    "sweep": Command(
        _sweep,
        "run a grid of training runs (presets x budgets x hyperparameter axes x seeds) through Hydra multirun",
        config="sweep",
        schema=_SWEEP,
        examples=(
            "diffllm sweep dry_run=true",
            "diffllm sweep sweep=paper launcher=submitit_slurm",
            "diffllm sweep --config-dir my_configs sweep=mine   # my_configs/sweep/mine.yaml, also seen by the jobs",
        ),
    ),
    "sweep collect": Command(
        _sweep_collect,
        "tabulate a sweep's run summaries into runs.csv and runs.md",
        config="sweep",
        schema=_SWEEP,
        examples=("diffllm sweep collect", "diffllm sweep collect sweep_dir=runs/sweep/paper out=reports"),
    ),
    "scaling fit": Command(
        _scaling_fit,
        "fit scaling laws to a collected sweep: ratios at equal loss, plots",
        config="scaling",
        schema=_root("diffllm.scaling.config:ScalingConfig"),
        examples=(
            "diffllm scaling fit sweep_dir=runs/sweep/micro",
            "diffllm scaling fit params=total joint=none reps=100",
        ),
    ),
    "scaling coord-check": Command(
        _coord_check,
        "mean |activation| per layer after a few steps at 5+ widths: flat if a parametrization transfers",
        config="coord_check",
        schema={**_MODEL, **_root("diffllm.scaling.config:CoordCheckConfig")},
        examples=(
            "diffllm scaling coord-check model=diff-tiny model.parametrization=mup",
            "diffllm scaling coord-check model=transformer-tiny widths=[16,32,64,128,256] steps=4 out=cc/sp",
        ),
    ),
    "generate": Command(
        _generate,
        "continue a prompt with a trained model (KV cache; greedy or sampled)",
        schema=_root("diffllm.eval.generate:GenerateConfig"),
        examples=(
            'diffllm generate run=runs/diff-tiny prompt="ROMEO:" max_new_tokens=60',
            'diffllm generate run=runs/diff-tiny prompt="ROMEO:" temperature=0.8 top_k=50 seed=1 stop=["\\n\\n"]',
        ),
    ),
    "eval ppl": Command(
        _eval_ppl,
        "loss, perplexity and bits per byte of a run, per held-out source",
        schema=_root("diffllm.eval.options:PplConfig"),
        examples=("diffllm eval ppl run=runs/diff-tiny", "diffllm eval ppl run=runs/diff-tiny data=my_texts/*.txt"),
    ),
    "eval needle": Command(
        _eval_needle,
        "multi-needle retrieval: accuracy by needles x depth x length, heatmap",
        schema=_root("diffllm.eval.options:NeedleConfig"),
        examples=(
            "diffllm eval needle run=runs/diff-tiny mode=synthetic",
            "diffllm eval needle run=runs/diff-tiny mode=text lengths=[256,512]",
        ),
    ),
    "eval recall": Command(
        _eval_recall,
        "associative recall on held-out key-value sets: accuracy by N x gap x length, bootstrap intervals",
        schema=_root("diffllm.eval.options:RecallConfig"),
        examples=(
            "diffllm eval recall run=runs/recall-tiny",
            "diffllm eval recall run=runs/recall-tiny n=[2,4,8] gaps=[0,16,32] lengths=[64,128] trials=64",
        ),
    ),
    "eval attention": Command(
        _eval_attention,
        "attention mass on the answer (needle, or recall pair) vs the rest of the context, per layer",
        schema=_root("diffllm.eval.options:AttentionConfig"),
        examples=(
            "diffllm eval attention run=runs/diff-tiny",
            "diffllm eval attention run=runs/diff-recall task=recall n=[2,4,8] gaps=[0,16] length=64 trials=32",
        ),
    ),
    "eval outliers": Command(
        _eval_outliers,
        "top-k activation and attention-logit magnitudes; loss with quantised logits",
        schema=_root("diffllm.eval.options:OutliersConfig"),
        examples=("diffllm eval outliers run=runs/diff-tiny",),
    ),
    "eval lm-eval": Command(
        _eval_lm_eval,
        "lm-evaluation-harness tasks through the native adapter (offline, local tasks)",
        schema=_root("diffllm.eval.harness:LmEvalConfig"),
        examples=("diffllm eval lm-eval run=runs/diff-tiny tasks=[plays_cloze]",),
    ),
    "eval icl": Command(
        _eval_icl,
        "many-shot in-context classification: accuracy by k, spread over demonstration orders",
        schema=_root("diffllm.eval.icl:IclConfig"),
        examples=(
            "diffllm eval icl run=runs/diff-tiny task=synthetic k=[0,1,4,16] permutations=5",
            "diffllm eval icl run=runs/diff-tiny task=trec/ label_field=coarse_label k=[0,4,max] permutations=10",
        ),
    ),
    "eval compare": Command(
        _eval_compare,
        "one table (and plots) of every eval result for several runs",
        schema=_root("diffllm.eval.compare:CompareConfig"),
        examples=("diffllm eval compare runs=[runs/diff-tiny,runs/transformer-tiny]",),
    ),
    "study attention": Command(
        _study("attention"),
        "the attention family at equal size: val loss, recall accuracy and KV cache per token against MHA",
        schema=_root("diffllm.studies.attention:Config"),
        examples=(
            "diffllm study attention lm=results/micro-attention/lm/runs.csv "
            "recall=results/micro-attention/recall/runs.csv out=results/micro-attention",
        ),
    ),
    "study claims": Command(
        _study("claims"),
        "eval ppl by_position and eval icl on a sweep's selected runs: NLL by position, ICL by k, order spread",
        schema=_root("diffllm.studies.claims:Config"),
        examples=("diffllm study claims sweep_dir=results/micro-claims/runs/runs.csv out=results/micro-claims",),
    ),
    "study compare": Command(
        _study("compare"),
        "two collected sweeps on the points both trained: paired differences, spreads, rankings",
        schema=_root("diffllm.studies.compare:Config"),
        examples=("diffllm study compare a=results/micro-branch/runs.csv b=results/micro-branch/control/runs.csv",),
    ),
    "study needle": Command(
        _study("needle"),
        "eval needle on a sweep's selected runs: accuracy by number of needles (needle.md)",
        schema=_root("diffllm.studies.needle:Config"),
        examples=("diffllm study needle sweep_dir=runs/sweep/micro",),
    ),
    "study outliers": Command(
        _study("outliers"),
        "eval outliers on a sweep's selected runs: top-1 logit and hidden state, loss and accuracy by logit bits",
        schema=_root("diffllm.studies.outliers:Config"),
        examples=("diffllm study outliers sweep_dir=runs/sweep/micro-branch out=results/micro-outliers",),
    ),
    "study recall": Command(
        _study("recall"),
        "the retrieval study: recall accuracy, steps to a level, attention probe",
        schema=_root("diffllm.studies.recall:Config"),
        examples=("diffllm study recall sweep_dir=runs/sweep/micro-recall out=results/micro-retrieval",),
    ),
    "study stability": Command(
        _study("stability"),
        "a learning-rate stability sweep: divergences, spikes, grad norms, outliers, lambda",
        schema=_root("diffllm.studies.stability:Config"),
        examples=("diffllm study stability sweep_dir=results/micro-stability/runs/runs.csv",),
    ),
    "study transfer": Command(
        _study("transfer"),
        "lr transfer across width: each width's best lr from a quadratic over seeds, its shift per doubling, sp vs mup",
        schema=_root("diffllm.studies.transfer:Config"),
        examples=("diffllm study transfer sweep_dir=results/micro-transfer/runs.csv out=results/micro-transfer",),
    ),
    "runs": Command(
        _runs,
        "one line per run below a folder: model, arch, tokens of budget, status, last val loss, last checkpoint",
        schema=_root("diffllm.overview:RunsConfig"),
        examples=("diffllm runs", "diffllm runs runs/sweep/micro"),
    ),
    "export": Command(
        _export,
        "write a run's checkpoint as a Hugging Face model directory",
        config="export",
        schema=_root("diffllm.export.commands:ExportConfig"),
        examples=(
            "diffllm export run=runs/diff-tiny out=hf/diff-tiny",
            "diffllm export run=runs/diff-tiny step=64 out=hf/diff-tiny-64 format=remote dtype=bfloat16",
        ),
    ),
    "import": Command(
        _import,
        "turn a Hugging Face model directory into a run at step 0",
        config="import",
        schema=_root("diffllm.export.commands:ImportConfig"),
        examples=(
            "diffllm import hf/stablelm-3b-4e1t out=runs/stablelm-cont",
            "diffllm train model.init_from=runs/stablelm-cont run_dir=runs/stablelm-cont-1   # then train on",
        ),
    ),
}
COMMANDS: dict[str, Command] = {name: Command(**{**c.__dict__, "name": name}) for name, c in _REGISTRY.items()}
