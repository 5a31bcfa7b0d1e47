"""Every command answers --help/-h (and `diffllm help <command>`) with its keys, defaults, meanings and examples; the
top level lists every command; the meanings come from the config files' and dataclasses' own comments."""

from __future__ import annotations

import sys

import pytest

from diffllm.cli.registry import COMMANDS

# Main keys each command's help must show with its default (key=default).
MAIN_KEYS = {
    "info": ["model=diff-tiny", "all=false", "seq_len=null", "model.d_model=128"],
    "tokenizer train": [
        "data=shakespeare",
        "out=null",
        "data.tokenizer.vocab_size=8192",
        "data.tokenizer.min_frequency=2",
    ],
    "data prepare": ["data=shakespeare", "out=prepared/${data.name}", "workers=1", "data.tokenize_chars=1048576"],
    "train": [
        "model=diff-tiny",
        "trainer=cpu",
        "run_dir=runs/${model.name}",
        "trainer.zero_stage=2",
        "model.lambda_init=null",
        "model.attn_backend=sdpa",
        "data.prepared_dir=null",
        "optim.lr=0.003",
    ],
    "plan": ["model=diff-830m", "tokens=100B", "gpus_per_node=8", "gpu=h100", "zero_stage=null"],
    "sweep": [
        "sweep=micro",
        "sweep_dir=runs/sweep/${sweep.name}",
        "launcher=basic",
        "dry_run=false",
        "sweep.seeds=[1, 2]",
        "sweep.grid_by_model={...}",
    ],
    "sweep collect": ["sweep=micro", "out=null", "sweep_dir=runs/sweep/${sweep.name}"],
    "scaling fit": ["sweep_dir=runs/sweep/micro", "params=block", "reps=400", "joint=auto"],
    "scaling coord-check": [
        "model=transformer-tiny",
        "widths=[16, 32, 64, 128, 256]",
        "steps=4",
        "model.parametrization=sp",
        "model.base_width=null",
        "model.base_head_dim=null",
    ],
    "export": ["run=null", "out=null", "step=latest", "format=auto", "dtype=float32"],
    "import": ["src=null", "out=null"],
}


def test_every_configured_command_is_covered():
    assert set(MAIN_KEYS) == {name for name, c in COMMANDS.items() if c.config}


@pytest.mark.parametrize("name", sorted(MAIN_KEYS))
def test_help_names_main_keys_and_examples(diffllm, name):
    flag = "-h" if name in ("plan", "info") else "--help"
    res = diffllm(*name.split(), flag)
    assert res.code == 0 and res.err == ""
    lines = res.out.splitlines()
    assert lines[0].startswith(f"usage: diffllm {name} ")
    for key in MAIN_KEYS[name]:
        assert any(line.strip().startswith(key) for line in lines), key
    examples = lines[lines.index("examples:") + 1 :]
    assert examples[0].strip() == COMMANDS[name].examples[0]
    assert "powered by Hydra" not in res.out and "== Config ==" not in res.out  # no Hydra boilerplate
    assert diffllm("help", *name.split()).out == res.out  # `diffllm help <command>`


def test_help_meanings_come_from_yaml_and_dataclass_comments(diffllm):
    out = diffllm("train", "--help").out
    line: dict[str, str] = {}  # key=default -> its line with the wrapped meaning's lines joined on
    for ln in out.splitlines():
        if ln.startswith("  ") and not ln.startswith("   ") and "=" in ln.split()[0]:
            key = ln.split()[0]
            line[key] = ln
        elif ln.startswith("   ") and line:
            line[key] += " " + ln.strip()
    # configs/trainer/cpu.yaml's own comment wins over the dataclass's for the same key
    assert line["trainer.micro_batch_size=8"].endswith("sequences per rank per forward")
    # only the dataclass has these keys (diffllm/model/config.py, diffllm/data/config.py comments)
    assert line["model.attn_backend=sdpa"].endswith(
        "eager (materialised maps, the reference) | sdpa | flash | triton (fused Diff kernel)"
    )
    assert line["data.tokenizer.train_chars=200000000"].endswith("training sources")
    # the config groups and their options
    assert "  model=diff-tiny   (" in out and "transformer-830m" in out and "  trainer=cpu   (8 options)" in out


def test_two_word_commands_and_help_help(diffllm):
    assert diffllm("tokenizer", "--help").out == diffllm("tokenizer", "train", "--help").out
    scaling = diffllm("scaling", "-h").out.splitlines()  # two subcommands: each named, with its summary
    assert scaling[0] == "subcommands:" and [ln.split()[:3] for ln in scaling[1:]] == [
        ["diffllm", "scaling", "fit"],
        ["diffllm", "scaling", "coord-check"],
    ]
    sweep = diffllm("sweep", "--help").out
    assert "subcommands: diffllm sweep collect" in sweep
    missing = diffllm("tokenizer")
    assert (
        missing.code == 2 and missing.err == "diffllm tokenizer: error: missing subcommand: diffllm tokenizer train\n"
    )


def test_top_level_help_and_version(diffllm):
    from diffllm import __version__

    res = diffllm("--help")
    assert res.code == 0 and res.out == diffllm().out == diffllm("-h").out == diffllm("help").out
    for name, c in COMMANDS.items():
        assert any(
            ln.split(None, len(name.split()))[: len(name.split())] == name.split() and ln.endswith(c.summary)
            for ln in res.out.splitlines()
        ), name
    assert "DIFFLLM_CONFIG_PATH" in res.out and "./configs" in res.out
    assert diffllm("--version").out == f"diffllm {__version__}\n"


def test_launch_parses_its_own_help(diffllm, monkeypatch):
    """`diffllm launch --help` and `diffllm help launch` hand --help to launch's own parser untouched."""
    import diffllm.launch.cli as launch

    seen = []
    monkeypatch.setattr(launch, "main", lambda: seen.append(list(sys.argv)))
    diffllm("launch", "--help")
    diffllm("help", "launch")
    diffllm("launch", "-h", "--nodes", "2")
    assert seen == [
        ["diffllm launch", "--help"],
        ["diffllm launch", "--help"],
        ["diffllm launch", "-h", "--nodes", "2"],
    ]


@pytest.mark.parametrize("name", sorted(n for n in COMMANDS if n != "launch"))
def test_every_key_value_command_is_typed_by_its_registry_entry(diffllm, name):
    """Every `key=value` command names its typed configs in its registry entry (the one place) and --help lists each
    key of their root dataclass (a config file's own command keys, or all of a config-less command's)."""
    import dataclasses

    from diffllm.config import schema_for

    schema = schema_for(name)
    assert schema and schema == schema_for(COMMANDS[name].config or name)
    out = diffllm(*name.split(), "--help").out
    root = schema.get("")
    for f in dataclasses.fields(root) if root else ():
        assert f"\n  {f.name}=" in out, (name, f.name)


def test_help_shows_defaults_as_yaml_and_whole_multi_line_comments(diffllm):
    """A config-less command shows its defaults as a command line writes them (null, false), and a comment that goes
    on under its field (or under a YAML-less dataclass field) is shown whole, wrapped, never cut mid-sentence."""
    out = diffllm("eval", "ppl", "--help").out
    assert "\n  data=null " in out and "\n  whole=false " in out and "None" not in out and "False" not in out
    text = " ".join(out.split())
    assert (
        "whole=false with a data.val_fraction config: score every document of its sources (mostly training text), "
        "not only the windows the trainer held out doc_mask=null" in text
    )
    train = " ".join(diffllm("train", "--help").out.split())
    assert (
        "(empty: all), e.g. [plays] so a synthetic source mixed into the data does not shape the vocabulary "
        "data.num_workers=1" in train
    )
    # a note between two fields (a short comment's line is complete) and a comment above a field are not swallowed
    rows = _keys_and_meanings(diffllm("train", "--help").out)
    assert rows["model.lambda_std=0.1"] == "diff: init std of lambda_{q,k}{1,2}"
    assert rows["model.init_from=null"].startswith("an HF model folder or a diffllm run to start from")
    assert all(len(line) <= 118 for line in diffllm("train", "--help").out.splitlines() if line.startswith("   "))


def _keys_and_meanings(out: str) -> dict[str, str]:
    """{key=default: its meaning} from a --help's keys section (wrapped meanings joined)."""
    rows: dict[str, str] = {}
    body = out.split("\nkeys (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    key = ""
    for ln in body:
        if ln.startswith("   ") and key:
            rows[key] = (rows[key] + " " + ln.strip()).strip()
        else:
            key, _, meaning = ln.strip().partition("  ")  # key=default, then two or more spaces
            rows[key] = meaning.strip()
    return rows


@pytest.mark.parametrize("name", sorted(n for n in COMMANDS if n != "launch"))
def test_every_key_in_every_help_says_what_it_means(diffllm, name):
    """Each key a command's --help lists has a meaning beside it (from its config file's or its dataclass's comment):
    a key a user can set but cannot read about is a gap."""
    rows = _keys_and_meanings(diffllm(*name.split(), "--help").out)
    assert rows and [k for k, meaning in rows.items() if not meaning] == []


def test_the_outlier_study_keys_say_what_they_mean(diffllm):
    """eval outliers' accuracy key and study outliers' keys (issue 33 §3) are described in their --help."""
    rows = _keys_and_meanings(diffllm("eval", "outliers", "--help").out)
    assert rows["cloze_items=300"].startswith("plays_cloze items (of 300) whose accuracy is measured at fp32 and each")
    study = diffllm("study", "outliers", "--help").out
    rows = _keys_and_meanings(study)
    assert rows["sweep_dir="].startswith("the sweep directory (or its collected runs.csv")
    assert rows["out=null"] == "the folder for outliers.md (default: the sweep's folder)"
    assert "study outliers" in diffllm("--help").out and "seed-paired against the Transformer" in study


_NO_HEAVY = """
import contextlib, io, sys
HEAVY = ("torch", "deepspeed", "datasets", "transformers", "matplotlib")
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"heavy import at --help: {name}")
sys.meta_path.insert(0, Refuse())
from diffllm.cli import main
from diffllm.cli.registry import COMMANDS
for name in COMMANDS:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            main([*name.split(), "--help"])
    except SystemExit:
        pass
    except ImportError as e:
        print(f"{name}: {e}")
"""


def test_help_imports_no_heavy_library():
    """`diffllm <command> --help` answers from the configs and the typed dataclasses alone: torch, deepspeed,
    datasets, transformers and matplotlib are not imported (each costs seconds on a loaded machine). One process
    that refuses those imports asks every command for its help."""
    import subprocess

    res = subprocess.run([sys.executable, "-c", _NO_HEAVY], capture_output=True, text=True, timeout=300)
    assert (res.returncode, res.stdout) == (0, ""), res.stdout + res.stderr[-2000:]
