"""`diffllm <command> --help`: a command's keys (diffllm/config/help.py: from its config file or its schema alone) with
its registry entry's summary, subcommands and examples; a command that parses its own argv (launch) prints its usage,
then the entry's examples."""

from __future__ import annotations

import contextlib
import io
import sys

from .registry import COMMANDS, load


def command_help(name: str, argv: list[str]) -> str:
    cmd = COMMANDS[name]
    if cmd.config is not None:
        from ..config.help import config_help

        subs = tuple(f"diffllm {n} ({c.summary})" for n, c in COMMANDS.items() if n.startswith(name + " "))
        return config_help(cmd.config, f"diffllm {name}", cmd.summary, cmd.examples, subs)
    if cmd.schema:
        from ..config.help import key_value_help

        return key_value_help(name, cmd.examples)
    sys.argv = [f"diffllm {name}"] + argv
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            load(cmd.entry)()  # the command's own usage
        except SystemExit as e:
            if e.code not in (0, None):
                raise
    text = out.getvalue().rstrip("\n")
    if cmd.examples and "\nexamples:" not in text:  # launch's usage lists its own
        text += "\n\nexamples:\n" + "\n".join(f"  {e}" for e in cmd.examples)
    return text
