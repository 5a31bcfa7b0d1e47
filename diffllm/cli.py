"""`diffllm <command> [hydra overrides]`: a thin dispatcher onto one Hydra app per command (configs/<command>.yaml)."""
from __future__ import annotations

import importlib
import sys

# "command [subcommand]" -> "module:function". Each function is a Hydra app (or parses its own argv).
COMMANDS = {
    "info": "diffllm.info:main",
    "tokenizer train": "diffllm.data.commands:train_main",
    "data prepare": "diffllm.data.commands:prepare_main",
    "train": "diffllm.train.app:main",
    "plan": "diffllm.scaling.planner:main",
    "launch": "diffllm.launch.cli:main",
    "sweep": "diffllm.sweep.cli:main",
    "sweep collect": "diffllm.sweep.cli:collect_main",
    "scaling fit": "diffllm.scaling.report:main",
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage: diffllm <command> [key=value ...]\n\ncommands:\n  " + "\n  ".join(sorted(COMMANDS)))
        return
    name = " ".join(argv[:2]) if " ".join(argv[:2]) in COMMANDS else argv[0]
    if name not in COMMANDS:
        sys.exit(f"diffllm: unknown command {argv[0]!r}; commands: {', '.join(sorted(COMMANDS))}")
    rest = argv[len(name.split()):]
    module, func = COMMANDS[name].split(":")
    sys.argv = [f"diffllm {name}"] + rest  # Hydra reads sys.argv
    getattr(importlib.import_module(module), func)()


if __name__ == "__main__":
    main()
