"""Every command line in README.md, docs/*.md and the comments of configs/**/*.yaml runs here, so that an example
cannot rot: the lines of ```bash blocks and the `$ ` lines of other blocks that call diffllm (`diffllm ...`,
`python -m diffllm...`, `torchrun|deepspeed ... diffllm.train ...`), and the commands in config comments
(config_examples). Cheap but real, in this process, in an empty folder holding the user configs the docs assume:
help, info, plan and `sweep dry_run=true` run for real; `launch` runs with --dry-run (added when absent); train lines
compose and build their typed configs and plan the budget at their world size (launch's own pre-flight check); the
other Hydra commands compose and build their typed configs; eval/generate parse their keys into their dataclass. A
line shown with its error output must fail with exactly that line (`...` in it matches anything) and exit code 2."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
# Error examples whose input is a state the doc describes in prose and no cheap fixture rebuilds (a trained run of
# another norm, a folder with a binary file, the hub): their keys and options are checked like any line instead.
NEEDS_STATE = {
    "diffllm tokenizer train data=plays": "mycorpus/plays/notes.txt, a binary file, from the walkthrough",
    "HF_HUB_OFFLINE=1 diffllm tokenizer train data=fineweb-edu": "loads the datasets library and asks the hub",
    "diffllm export run=runs/diff-tiny-ln out=hf/x format=diffllama": "a trained layernorm run",
    "diffllm import hf/random-llama out=runs/llama-imported": "a run imported once before",
    "diffllm launch --launcher deepspeed --hostfile /tmp/hosts2 --nodes 2 --procs 1 "
    "model=diff-tiny": "node-a answers over ssh: tests/launch/local_ssh.sh "
    "(tests/launch/test_deepspeed_ssh_real.py runs this one)",
    'python -m diffllm.eval.generate run=runs/diff-tiny prompt="$(python -c '
    '\'print("word " * 600)\')"': "a trained runs/diff-tiny",
}
# What the docs assume exists in the folder they run in (their own configs, described beside the commands).
USER_CONFIGS = {
    "configs/data/plays.yaml": "data/shakespeare.yaml",
    "configs/data/mix.yaml": "data/shakespeare.yaml",
    "configs/data/mine.yaml": "data/shakespeare.yaml",
    "my_configs/sweep/mine.yaml": "sweep/micro.yaml",
    "myconfigs/sweep/mine.yaml": "sweep/micro.yaml",
    # docs/model.md's gated-tiny is a user's attention variant; its preset stands in as diff-tiny's size
    "myconfigs/model/gated-tiny.yaml": "model/diff-tiny.yaml",
}
# Lines run for real elsewhere that take too long for this file: checked like lines that need a run.
SLOW = {"diffllm info all=true": "every preset's table, 20-50 s (the README table is its output)"}
FOLDERS = ("runs/empty", "tmp/evalruns/empty")  # error examples of commands given an empty run directory


@dataclass
class Example:
    where: str  # file:line
    line: str  # as written (continuations joined)
    error: Optional[str]  # the documented error line, if it is an error example
    setup: list[str]  # `printf ... > file` lines before it in the same block

    def __str__(self) -> str:
        return self.where


def _is_diffllm(words: list[str]) -> bool:
    if not words:
        return False
    return (
        words[0] == "diffllm"
        or (words[0] in ("python", "python3") and words[1:3][:1] == ["-m"] and words[2].startswith("diffllm"))
        or (words[0] in ("torchrun", "deepspeed") and "diffllm.train" in words)
    )


def _strip(line: str) -> str:
    """The command alone: no `time`, no `; echo ...`, no trailing `&` or comment."""
    line = re.sub(r"^time\s+", "", line.strip())
    line = re.split(r";\s*echo\b", line)[0]
    words = shlex.split(line, comments=True, posix=False)
    return " ".join(w for w in words if w != "&")


def examples() -> list[Example]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for block in _BLOCK.finditer(text):
            lang, body = block.group(1), block.group(2)
            first = text[: block.start(2)].count("\n") + 1
            lines, setup, i = body.splitlines(), [], 0
            while i < len(lines):
                raw, number = lines[i], first + i
                prompt = raw.startswith("$ ")
                if not (prompt or lang in ("bash", "sh")) or raw.lstrip().startswith("#"):
                    i += 1
                    continue
                cmd = raw[2:] if prompt else raw
                while cmd.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
                output = []
                while prompt and i < len(lines) and not lines[i].startswith("$ "):
                    output.append(lines[i])
                    i += 1
                for part in re.split(r";\s+(?=diffllm )", cmd):
                    words = [w for w in _strip(part).split() if not _ENV_WORD.match(w)]
                    if part.strip().startswith("printf ") and ">" in part:
                        setup.append(part.strip())
                    if not _is_diffllm(words):
                        continue
                    error = next((o for o in output[:1] if re.match(r"diffllm[\w \-]*: ", o)), None)
                    out.append(Example(f"{doc.relative_to(REPO)}:{number}", part.strip(), error, list(setup)))
    return out


# Command lines in the configs' comments: a comment line that starts with one (a trailing `\\` joins the next comment
# line; `and`, `then` and `;` separate several), and any `diffllm ...` in backticks. Usage synopses (`[key=value]`,
# `<dir>`, `a|b`) and abbreviations (`... shard=1/2`) are not commands.
_TICKED = re.compile(r"`((?:diffllm|python -m diffllm)\b[^`]*)`")
_SYNOPSIS = re.compile(r"(^|\s)\[|<\w|\||\.\.\.")


def config_examples() -> list[Example]:
    out, seen = [], set()
    for path in sorted((REPO / "configs").rglob("*.yaml")):
        lines, i = path.read_text().splitlines(), 0
        while i < len(lines):
            number, m = i + 1, re.match(r"\s*#\s?(.*)$", lines[i])
            i += 1
            if not m:
                continue
            text = m.group(1).strip()
            while text.endswith("\\") and i < len(lines) and lines[i].lstrip().startswith("#"):
                text, i = text[:-1] + " " + lines[i].lstrip()[1:].strip(), i + 1
            found = _TICKED.findall(text)
            if text.startswith(("diffllm ", "python -m diffllm")):
                found += re.split(r"\s+and\s+|\s+then\s+|;\s+", text)
            for line in (re.sub(r"\s+\(.*\)$|(?<!\.)[.,;]$", "", c.strip()) for c in found):
                if _is_diffllm(line.split()) and not _SYNOPSIS.search(line) and line not in seen:
                    seen.add(line)
                    out.append(Example(f"{path.relative_to(REPO)}:{number}", line, None, []))
    return out


def _params(found: list[Example]) -> list:
    """A config's sweep runs its dry run for real, every pending job composed: 10-40 s each, so `make test-slow`."""
    sweep = lambda ex: ex.line.split()[1:2] == ["sweep"] and ex.line.split()[2:3] != ["collect"]  # noqa: E731
    return [
        pytest.param(ex, marks=pytest.mark.slow) if ex.where.startswith("configs/") and sweep(ex) else ex
        for ex in found
    ]


EXAMPLES = examples() + config_examples()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """An empty folder with the configs the docs name as the user's own."""
    root = tmp_path_factory.mktemp("docs")
    for path, packaged in USER_CONFIGS.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        text = (REPO / "configs" / packaged).read_text()
        (root / path).write_text(text.replace("name: diff-tiny", "name: gated-tiny"))
    for folder in FOLDERS:
        (root / folder).mkdir(parents=True)
    (root / "scripts").mkdir()
    shutil.copy(REPO / "scripts/hostfile.example", root / "scripts")
    for data in ("results/micro-transfer/runs.csv",):  # committed sweep results that examples read (lr_from=)
        (root / data).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / data, root / data)
    (root / "hf/gpt2").mkdir(parents=True)
    (root / "hf/gpt2/config.json").write_text('{"model_type": "gpt2"}')
    return root


def _argv(ex: Example, root: Path) -> list[str]:
    """The words as bash would pass them ($(...), quotes), /tmp/ paths moved into the workspace."""
    line = _strip(ex.line).replace("/tmp/", f"{root}/tmp/")
    out = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, text=True, cwd=root, check=True
    ).stdout
    words = [w for w in out.split("\0")[:-1] if not _ENV_WORD.match(w)]
    return [w for w in words if "..." not in w and not re.search(r"<\w+>", w)]  # `...`, `<yours>`: placeholders


def _command(words: list[str]) -> tuple[str, list[str], int]:
    """(registry command, its arguments, world size)."""
    from diffllm.cli.main import resolve

    if words[0] in ("torchrun", "deepspeed"):
        at = words.index("diffllm.train")
        opts = dict(zip(words[1:at], words[2 : at + 1]))
        size = int(opts.get("--nproc_per_node", opts.get("--num_gpus", opts.get("--num_accelerators", 1))))
        return "train", words[at + 1 :], size * int(opts.get("--nnodes", opts.get("--num_nodes", 1)))
    if words[0].startswith("python"):
        module, rest = words[2], words[3:]
        if module == "diffllm.cli":
            return (*resolve(rest), 1)
        return MODULES[module], rest, 1
    if len(words) < 2 or words[1].startswith("-") or words[1] == "help":
        return "", words[1:], 1
    try:
        return (*resolve(words[1:]), 1)
    except SystemExit:  # `diffllm trian`: the dispatcher's own error example
        return "", words[1:], 1


MODULES = {
    "diffllm.train": "train",
    "diffllm.eval.generate": "generate",
    "diffllm.eval.ppl": "eval ppl",
    "diffllm.eval.needle": "eval needle",
    "diffllm.eval.attention": "eval attention",
    "diffllm.eval.outliers": "eval outliers",
    "diffllm.eval.harness": "eval lm-eval",
    "diffllm.eval.compare": "eval compare",
    "diffllm.eval.recall": "eval recall",
}


def _run_cli(words: list[str]) -> tuple[int, str, str]:
    """`diffllm <words>` in this process: (exit code, stdout, stderr)."""
    from diffllm.cli.main import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(words)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def _check_keys(name: str, args: list[str], size: int) -> None:
    """A line that needs a run or data: its keys, group options and typed values (train: its budget too)."""
    from diffllm.cli.registry import COMMANDS
    from diffllm.config import (
        check_group_options,
        check_typed,
        compose,
        config_groups,
        from_key_values,
        register_schema,
        schema_for,
        take_config_dirs,
    )

    args = take_config_dirs(args)
    if name == "train":
        from diffllm.launch.checks import check_train_overrides

        check_train_overrides(args, size)
        return
    if name == "import":
        args = [a if "=" in a else f"src={a}" for a in args]
    config = COMMANDS[name].config
    if config:
        check_group_options(args, config_groups(config))
        check_typed(compose(config, args), register_schema(config))
    else:
        (cls,) = schema_for(name).values()
        from_key_values(cls, args, name.split()[-1])


def _hold_port(ex: Example, words: list[str]):
    """`# 29612 already taken`: something listens on that port while the example runs."""
    if "already taken" not in ex.line:
        return contextlib.nullcontext()
    sock = socket.socket()
    sock.bind(("127.0.0.1", int(words[words.index("--master-port") + 1])))
    sock.listen()
    return contextlib.closing(sock)


@pytest.mark.parametrize("ex", _params(EXAMPLES), ids=str)
def test_documented_command_runs(ex: Example, workspace: Path, monkeypatch):
    monkeypatch.chdir(workspace)
    monkeypatch.setattr("sys.argv", ["diffllm"])  # the commands set their own
    monkeypatch.delenv("DIFFLLM_CONFIG_PATH", raising=False)
    for line in ex.setup:  # the example's own files (hostfiles), under the workspace
        subprocess.run(["bash", "-c", line.replace("/tmp/", f"{workspace}/tmp/")], cwd=workspace, check=True)
    words = _argv(ex, workspace)
    name, args, size = _command(words)
    launch = name == "launch"
    if ex.error and _strip(ex.line) not in NEEDS_STATE:
        if launch and "ssh" in ex.error and shutil.which("ssh") is None:
            pytest.skip("no ssh on this machine")
        if name == "train":  # the error must come before training starts: from the configs (else: no error here)
            with pytest.raises(Exception):  # noqa: B017 - a composition error or a ValueError
                _check_keys(name, args, size)
        with _hold_port(ex, args):
            code, _, err = _run_cli([*name.split(), *args])
        expected = ex.error.replace("/tmp/", f"{workspace}/tmp/")
        pattern = ".*".join(re.escape(p) for p in expected.split("..."))
        last = (err.strip().splitlines() or [""])[-1]  # launch notes "# run this on each node" first
        assert code == 2 and re.fullmatch(pattern, last), f"{ex.line}\nexpected: {expected}\ngot ({code}): {err}"
        return
    if (
        name in ("", "info", "plan")
        and _strip(ex.line) not in SLOW
        or "--help" in args
        or "-h" in args
        or words[1:2] == ["help"]
    ):
        code, out, err = _run_cli(words[1:] if words[0] == "diffllm" else [name, *args])
    elif launch:
        code, out, err = _run_cli(["launch", *args, *([] if "--dry-run" in args else ["--dry-run"])])
    elif name == "sweep":
        code, out, err = _run_cli(["sweep", *args, *([] if "dry_run=true" in args else ["dry_run=true"])])
    else:
        _check_keys(name, args, size)
        return
    assert code == 0, f"{ex.line}\nexit {code}: {err[-2000:]}"


# ---------------------------------------------------------------------------------------- README's block, in order
# README's command block runs top to bottom in one folder, each line as typed plus the overrides below (tiny budgets
# where the line's command takes them): a line must find what the lines above it made, and no line may refuse a run
# that another line made. Training lines (and torchrun) run as processes (a run ends in os._exit), the rest here.
TINY = {
    "train": [
        "model.d_model=64",
        "model.n_layers=2",
        "data.seq_len=64",
        "data.tokenizer.vocab_size=1024",  # the session's BPE (tests/conftest.py), trained once
        "data.num_workers=0",
        "trainer.micro_batch_size=4",
        "trainer.global_batch_tokens=1024",
        "trainer.tokens=8192",
        "trainer.val_every=4",
        "trainer.val_batches=2",
        "trainer.val_tokens=4096",
        "trainer.save_every_steps=4",
        "optim.warmup_steps=2",
    ],
    "tokenizer train": ["data.tokenizer.vocab_size=1024"],
    "data prepare": ["data.tokenizer.vocab_size=1024"],
    "sweep": ["sweep.models=[transformer-micro-1,diff-micro-1]", "~sweep.grid_by_model", "sweep.tokens=[3072]"]
    + ["sweep.seeds=[1]"],
    "eval ppl": ["max_tokens=4096"],
    "eval needle": ["trials=2"],
    "eval recall": ["trials=4", "bootstrap=0"],
    "eval outliers": ["tokens=1024", "cloze_items=8"],
    "eval compare": ["evals=[ppl]"],  # the ppl of runs/t3 computed here (the other evals ran on runs/diff-tiny above)
}
TINY_VALUES = {"trainer.branch_budgets": "[4096]"}  # a value of the line's own, replaced (a branch inside 8192 tokens)


def readme_block() -> list[Example]:
    """The lines of README.md's command block (the one that trains, evaluates and exports), in order."""
    text = (REPO / "README.md").read_text()
    block = next(b for b in _BLOCK.finditer(text) if "diffllm export run=" in b.group(2))
    first = text[: block.start(2)].count("\n") + 1
    last = first + block.group(2).count("\n")
    return [ex for ex in examples() if ex.where.startswith("README.md:") and first <= int(ex.where[10:]) <= last]


def _tiny_values(words: list[str]) -> list[str]:
    return [f"{w.split('=')[0]}={TINY_VALUES[w.split('=')[0]]}" if w.split("=")[0] in TINY_VALUES else w for w in words]


@pytest.mark.slow  # 300 s at load average 10 on 2 cores: every train, sweep, eval and export line, for real
def test_readme_block_runs_top_to_bottom(tmp_path, monkeypatch, tokenizer):
    """Issue 56: typed in order after `make train`, the doc-mask and spike lines reused runs/diff-tiny and were refused
    as a changed finished run, `eval compare` named a run no line made, and `diffllm runs` a folder no line wrote."""
    import os
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["diffllm"])
    monkeypatch.delenv("DIFFLLM_CONFIG_PATH", raising=False)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    lines = [ex for ex in readme_block() if _strip(ex.line) not in SLOW]  # SLOW: run for real elsewhere
    assert len(lines) >= 28 and lines[0].line.startswith("diffllm --help")
    for ex in lines:
        words = _argv(ex, tmp_path)
        name, args, _ = _command(words)
        extra = [] if "--help" in words or "dry_run=true" in words else TINY.get(name, [])
        if name == "train":
            done = subprocess.run(
                [*_tiny_values(words), *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
            )
            code, err = done.returncode, done.stderr
        else:
            code, _, err = _run_cli([*(words[1:] if words[0] == "diffllm" else [name, *args]), *extra])
        assert code == 0, f"{ex}: {ex.line}\nexit {code}: {err[-3000:]}"
    assert {p.name for p in (tmp_path / "runs").iterdir()} >= {"diff-tiny", "t3", "doc-mask", "spikes", "cont"}
