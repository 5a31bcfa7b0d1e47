"""`diffllm <command> [key=value ...]`: the dispatcher over the command registry (registry.py): it finds the command,
answers --help (help.py), checks `group=option` arguments before the command's heavy imports, and calls its entry."""

from __future__ import annotations

import difflib
import os
import sys

from .registry import COMMANDS, load


def overview() -> str:
    from .. import __version__

    width = max(map(len, COMMANDS)) + 2
    lines = [
        f"diffllm {__version__}: pretrain Transformers and Differential Transformers, and compare them.",
        "",
        "usage: diffllm <command> [--config-dir DIR] [group=option ...] [key=value ...]",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}{c.summary}" for name, c in COMMANDS.items()]
    lines += [
        "",
        "`diffllm <command> --help` (or `diffllm help <command>`): its keys, defaults and examples.",
        "Configs are looked up in $DIFFLLM_CONFIG_PATH (colon-separated; `--config-dir DIR` prepends),",
        "./configs, then the packaged configs: `data=mine` finds ./configs/data/mine.yaml.",
    ]
    return "\n".join(lines)


def resolve(argv: list[str]) -> tuple[str, list[str]]:
    """(command name, its arguments); SystemExit(2) with a "did you mean" for an unknown command."""
    from ..config import fail

    for n in (2, 1):
        name = " ".join(argv[:n])
        if len(argv) >= n and name in COMMANDS:
            return name, argv[n:]
    family = [name for name in COMMANDS if name.split()[0] == argv[0]]
    if family and len(argv) > 1 and argv[1] in ("-h", "--help"):
        if len(family) == 1:  # `diffllm tokenizer --help` -> tokenizer train's help
            return family[0], argv[1:]
        width = max(16, max(len(n) for n in family) + 2)
        print("subcommands:\n" + "\n".join(f"  diffllm {n:<{width}}{COMMANDS[n].summary}" for n in family))
        raise SystemExit(0)
    if family and len(argv) == 1:
        fail(f"diffllm {argv[0]}", f"missing subcommand: {', '.join('diffllm ' + n for n in family)}")
    word = " ".join(argv[:2]) if family else argv[0]
    close = difflib.get_close_matches(
        word, list(COMMANDS) if family else sorted({n.split()[0] for n in COMMANDS}), n=1, cutoff=0.5
    )
    hint = f" (did you mean {close[0]}?)" if close else f" (commands: {', '.join(COMMANDS)})"
    fail("diffllm", f"unknown command {word!r}{hint}")


def main(argv: list[str] | None = None) -> None:
    try:
        dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `diffllm train --help | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None


def dispatch(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(overview())
        return
    if argv[0] in ("-V", "--version"):
        from .. import __version__

        print(f"diffllm {__version__}")
        return
    if argv[0] == "help":
        return dispatch(argv[1:] + ["--help"] if argv[1:] else [])
    from ..config import check_group_options, config_groups, one_line_errors, take_config_dirs

    name, rest = resolve(argv)
    cmd = COMMANDS[name]
    rest = take_config_dirs(rest)  # into $DIFFLLM_CONFIG_PATH: the command and every process it starts see it
    prog = f"diffllm {name}"
    # bad input the command itself does not catch (a config of the user's that is not YAML, found by any command):
    # one line, exit code 2
    with one_line_errors(prog):
        if "-h" in rest or "--help" in rest:
            from .help import command_help

            print(command_help(name, rest))
            return
        if cmd.config is not None:  # before the command's (heavy) imports: a mistyped preset answers at once
            check_group_options(rest, config_groups(cmd.config))
        sys.argv = [prog] + rest  # Hydra (or the command's own parser) reads sys.argv
        load(cmd.entry)()


if __name__ == "__main__":
    main()
