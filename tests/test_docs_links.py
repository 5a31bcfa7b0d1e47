"""Every relative link in README.md, docs/**/*.md and the studies' tables (results/**/*.md) names a file or folder
that is in the repository: it exists, and git does not ignore it (a link to a path .gitignore hides works in the work
tree that wrote it and is dead in every clone: the per-run data of three studies was lost that way)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "results").rglob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target): markdown's inline links
_CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.S | re.M)  # links inside code are examples, not links


def relative_links(page: Path) -> list[str]:
    """The page's link targets that name a path in this repository (no scheme, no pure #anchor), anchors cut."""
    text = _CODE.sub("", page.read_text())
    targets = (m.group(1).split("#", 1)[0] for m in _LINK.finditer(text))
    return [unquote(t) for t in targets if t and not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def ignored(paths: list[Path]) -> set[Path]:
    """Those of `paths` that git ignores (none outside a git checkout, e.g. an unpacked sdist)."""
    if not paths or not (REPO / ".git").exists():
        return set()
    done = subprocess.run(
        ["git", "check-ignore", "--stdin"],
        input="\n".join(str(p.relative_to(REPO)) for p in paths),
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return {REPO / line for line in done.stdout.splitlines()}


def test_relative_links_point_into_the_repository():
    targets = {}
    for page in PAGES:
        for link in relative_links(page):
            targets.setdefault((page.parent / link).resolve(), []).append(f"{page.relative_to(REPO)}: {link}")
    inside = [t for t in targets if t.is_relative_to(REPO)]
    missing = [where for t in inside if not t.exists() for where in targets[t]]
    hidden = [where for t in ignored([t for t in inside if t.exists()]) for where in targets[t]]
    outside = [where for t in targets if not t.is_relative_to(REPO) for where in targets[t]]
    assert not missing, "links to paths that do not exist:\n" + "\n".join(sorted(missing))
    assert not hidden, "links to paths git ignores (dead in a clone):\n" + "\n".join(sorted(hidden))
    assert not outside, "links out of the repository:\n" + "\n".join(sorted(outside))
    assert len(inside) > 50  # the pages do link their files: a parser that found none would pass above


@pytest.mark.parametrize(
    "text, links",
    [
        ("see [runs.md](micro/runs.md) and [a](https://x.org/y) or [b](#anchor)", ["micro/runs.md"]),
        ("[fits](scaling.md#fits) and `[not](a/link.md)`", ["scaling.md"]),
        ("```\n[x](in/a/block.md)\n```\n[y](docs/%C3%A9.md)", ["docs/é.md"]),
    ],
)
def test_the_link_parser(tmp_path, text, links):
    page = tmp_path / "page.md"
    page.write_text(text)
    assert relative_links(page) == links


def test_git_ignores_the_training_folder_and_not_a_studys_kept_runs():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    probe = [
        REPO / "runs" / "diff-tiny" / "summary.json",
        REPO / "results" / "a-new-study" / "runs" / "runs" / "x.jsonl",
    ]
    assert ignored(probe) == {probe[0]}
