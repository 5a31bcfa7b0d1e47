"""scripts/bench_generate.py on tiny settings: one row per preset and context, MHA/GQA/MLA/Diff/Diff V2 side by side,
the reference's ratio 1.00, and the cache bytes it measures in bf16 equal to each variant's declaration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts.test_scripts import ROOT, env, table_rows


@pytest.mark.slow
def test_bench_generate_prints_every_preset_at_every_context(tmp_path: Path):
    presets = ["transformer-tiny", "transformer-tiny-gqa", "mla-tiny", "diff-tiny", "diff2-tiny"]
    args = ["--contexts", "8", "24", "--new-tokens", "2", "--rounds", "2", "--dtype", "bfloat16"]
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_generate.py"), *args, "--json", str(tmp_path / "b.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env(),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    for preset in presets:
        rows = table_rows(res.stdout, preset)
        assert [r[2] for r in rows] == ["8", "24"], res.stdout
        assert all(r[5] == r[6] for r in rows)  # measured bf16 cache bytes per token == declared
    assert [r[4] for r in table_rows(res.stdout, "transformer-tiny")] == ["1.00", "1.00"]
    figures = {(r["preset"], r["context"]): r for r in json.loads((tmp_path / "b.json").read_text())}
    assert figures["mla-tiny", 8]["declared_bf16"] == 4 * (4 * 32 + 16) * 2  # 4 layers x (c_KV 4d + k^R d/2), bf16
    assert figures["transformer-tiny-gqa", 24]["declared_bf16"] * 2 == figures["transformer-tiny", 24]["declared_bf16"]
