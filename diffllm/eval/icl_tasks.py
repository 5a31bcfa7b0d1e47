"""The classification tasks of `diffllm eval icl`: local files in the formats researchers keep (JSONL, parquet, a
`datasets` save_to_disk folder) with a text and a label field, and the builtin `synthetic` task. Nothing downloads.

A task gives, for each query i, an Episode: the query (text, label index) and the demonstrations a prompt may use
(in the order they are taken: k demonstrations are the first k, so the prompts of growing k are nested). File tasks:
the queries are `queries` examples of the test split (a DatasetDict's `test`/`validation`, else a seeded share of the
one table) and the demonstrations are drawn, per query and seeded, without replacement from the rest (the `train`
split). `synthetic`: every prompt gets its own random word -> label mapping, so no weight can hold the answer; only
the prompt's demonstrations say which label a word has.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

from ..data.icl import SYNTHETIC_LABELS, mapping  # the synthetic task's words live with its training source
from .common import EvalError


@dataclass
class Episode:
    query: tuple[str, int]  # (text, label index)
    demos: List[tuple[str, int]]  # the demonstrations in the order a prompt takes them


@dataclass
class Task:
    name: str
    labels: List[str]  # label strings, index = label id
    episodes: List[Episode]


def synthetic(queries: int, seed: int, max_demos: int = 4096, n_words: int = 4) -> Task:
    """Per prompt: `n_words` words drawn from WORDS, each given a random label of SYNTHETIC_LABELS (both labels
    used); the demonstrations are (word, its label) drawn uniformly from those words, the query one of them. Its
    training source, with WORDS and the labels: diffllm/data/icl.py (format: icl), a mapping drawn the same way."""
    import numpy as np

    episodes = []
    for i in range(queries):
        rng = np.random.default_rng([seed, i])
        words, labels = mapping(rng, n_words)  # balanced, shuffled: per prompt (as data/icl.py's per document)
        demos = [(words[j], int(labels[j])) for j in rng.integers(0, n_words, max_demos)]
        q = int(rng.integers(0, n_words))
        episodes.append(Episode((words[q], int(labels[q])), demos))
    return Task("synthetic", list(SYNTHETIC_LABELS), episodes)


BUILTIN = {"synthetic": synthetic}


def read_table(path: Path) -> tuple[dict[str, list], dict[str, Any]]:
    """{split: rows} and {field: ClassLabel names} of a JSONL / parquet file or a save_to_disk folder (a Dataset:
    one split "all"; a DatasetDict: its splits)."""
    if path.is_dir():
        import datasets

        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as e:  # noqa: BLE001 - whatever the library raises for a folder that is not a dataset
            raise EvalError(f"task={path}: not a datasets save_to_disk folder ({str(e).splitlines()[0]})") from None
        parts = ds if isinstance(ds, datasets.DatasetDict) else {"all": ds}
        names = {
            f: feat.names
            for d in parts.values()
            for f, feat in d.features.items()
            if isinstance(feat, datasets.ClassLabel)
        }
        return {s: d.to_list() for s, d in parts.items()}, names
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        meta = json.loads((table.schema.metadata or {}).get(b"huggingface", b"{}"))  # features of Dataset.to_parquet
        feats = (meta.get("info") or {}).get("features") or {}
        names = {f: v["names"] for f, v in feats.items() if isinstance(v, dict) and v.get("_type") == "ClassLabel"}
        return {"all": table.to_pylist()}, names
    if path.suffix in (".jsonl", ".json"):
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    row = None
                if not isinstance(row, dict):
                    raise EvalError(f"task={path}:{n}: not a JSON object per line")
                rows.append(row)
        return {"all": rows}, {}
    raise EvalError(f"task={path}: neither a builtin task ({', '.join(BUILTIN)}) nor a .jsonl/.parquet file or folder")


def label_strings(rows: list, field: str, given: Optional[Sequence[str]], class_names: Optional[list]) -> list[str]:
    """The label strings: `given` (label_names=), a ClassLabel's names, or the sorted distinct string labels."""
    if given:
        return [str(x) for x in given]
    if class_names:
        return list(class_names)
    values = {r[field] for r in rows}
    if any(not isinstance(v, str) for v in values):
        raise EvalError(f"label_field={field}: integer labels need label_names=[...] (or a ClassLabel feature)")
    return sorted(values)


def check_fields(rows: list, where: str, text_field: str, label_field: str) -> None:
    for n, r in enumerate(rows):
        if text_field not in r or label_field not in r:
            missing = text_field if text_field not in r else label_field
            raise EvalError(f"task={where}: row {n} has no field {missing!r} (fields: {', '.join(r)})")


def examples(rows: list, where: str, text_field: str, label_field: str, labels: list[str]) -> list[tuple[str, int]]:
    out = []
    for n, r in enumerate(rows):
        y = r[label_field]
        if isinstance(y, str):
            if y not in labels:
                raise EvalError(f"task={where}: row {n}: label {y!r} is not one of label_names {labels}")
            y = labels.index(y)
        elif not 0 <= int(y) < len(labels):
            raise EvalError(f"task={where}: row {n}: label {y} out of range for {len(labels)} label names")
        out.append((str(r[text_field]), int(y)))
    return out


def from_file(
    path: Path, text_field: str, label_field: str, label_names: Optional[Sequence[str]], queries: int, seed: int
) -> Task:
    import numpy as np

    splits, class_names = read_table(path)
    rows = [r for s in splits.values() for r in s]
    if not rows:
        raise EvalError(f"task={path}: no rows")
    check_fields(rows, str(path), text_field, label_field)
    labels = label_strings(rows, label_field, label_names, class_names.get(label_field))
    test = next((s for s in ("test", "validation") if s in splits), None)
    if test is not None and "train" in splits:
        qs = examples(splits[test], str(path), text_field, label_field, labels)
        pool = examples(splits["train"], str(path), text_field, label_field, labels)
        qs = [qs[j] for j in np.random.default_rng(seed).permutation(len(qs))[:queries]]
    else:
        every = examples(rows, str(path), text_field, label_field, labels)
        order = np.random.default_rng(seed).permutation(len(every))
        qs, pool = [every[j] for j in order[:queries]], [every[j] for j in order[queries:]]
    if not pool:
        raise EvalError(f"task={path}: {len(rows)} rows leave no demonstrations after queries={queries}")
    episodes = []
    for i, q in enumerate(qs):
        draw = np.random.default_rng([seed, i, 1]).permutation(len(pool))
        episodes.append(Episode(q, [pool[j] for j in draw]))
    return Task(path.stem, labels, episodes)


def load_task(
    task: str, text_field: str, label_field: str, label_names: Optional[Sequence[str]], queries: int, seed: int
) -> Task:
    if task in BUILTIN:
        return BUILTIN[task](queries, seed)
    path = Path(task)
    if not path.exists():
        raise EvalError(f"task={task}: neither a builtin task ({', '.join(BUILTIN)}) nor an existing file or folder")
    return from_file(path, text_field, label_field, label_names, queries, seed)
