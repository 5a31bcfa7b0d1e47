"""`diffllm study <name> key=value ...`: the studies that turn collected sweeps into the tables and figures of
docs/micro-*.md, one module per study (each a typed `Config` and a `run(config)`), what they share in common.py."""
from __future__ import annotations

import difflib
import importlib
import sys
from typing import Optional

# name -> what it makes (its module: diffllm/studies/<name>.py)
STUDIES = {
    "compare": "two collected sweeps on the points both trained: paired differences, spreads, rankings",
    "needle": "eval needle on a sweep's selected runs: accuracy by number of needles (needle.md)",
    "recall": "the retrieval study: recall accuracy, steps to a level, attention probe (study.md, recall_vs_step.png)",
    "stability": "a learning-rate stability sweep: divergences, spikes, grad norms, outliers, lambda",
}


def usage() -> str:
    width = max(map(len, STUDIES)) + 2
    return "\n".join(["usage: diffllm study <name> key=value ...", "", "studies:"]
                     + [f"  {name:<{width}}{what}" for name, what in STUDIES.items()]
                     + ["", "`diffllm study <name> --help`: its keys and defaults."])


def main(argv: Optional[list[str]] = None) -> None:
    from ..config import fail
    from ..eval.common import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    if not argv or argv[0] not in STUDIES:
        got = f"unknown study {argv[0]!r}" if argv else "missing the study's name"
        near = difflib.get_close_matches(argv[0], list(STUDIES), n=1) if argv else []
        hint = f"; did you mean {near[0]}?" if near else f" (studies: {', '.join(STUDIES)})"
        fail("diffllm study", got + hint)
    name = argv[0]
    module = importlib.import_module(f"{__name__}.{name}")
    cli(f"study {name}", module.Config, module.run, argv[1:])
