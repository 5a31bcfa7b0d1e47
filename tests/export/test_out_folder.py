"""`diffllm export`'s out folder: a non-empty one is refused (one line, exit 2) unless force=true, which replaces it
whole; the files are written aside and renamed, so a failed export leaves `out` as it was and no partial folder."""

from __future__ import annotations

import json

import pytest

import diffllm.export.hf as hf
from tests.distributed import cli_here


def siblings(out) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


def test_a_non_empty_out_is_refused_in_one_line_before_the_run_is_read(tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text("{}")
    got = cli_here(
        "export", f"run={tmp_path / 'no-such-run'}", f"out={out}"
    )  # refused first: the run is not even looked at
    assert got.returncode == 2 and got.stdout == ""
    assert got.stderr == (
        f"diffllm export: error: out={out}: not empty (config.json); choose a new folder, or pass force=true to "
        "replace it and all it holds\n"
    )
    assert (out / "config.json").read_text() == "{}" and siblings(out) == []
    (tmp_path / "file").write_text("")
    got = cli_here("export", f"run={tmp_path / 'no-such-run'}", f"out={tmp_path / 'file'}")
    assert got.returncode == 2 and "file: is a file, not a folder" in got.stderr


def test_force_replaces_the_folder_whole_and_a_failed_export_leaves_it_as_it_was(fast_runs, tmp_path, monkeypatch):
    out = tmp_path / "hf"
    hf.export_run(fast_runs["diff-interleaved-gqa"], out)  # a DiffLlama export ...
    (out / "unrelated.txt").write_text("mine")
    with pytest.raises(hf.UserError, match="not empty"):
        hf.export_run(fast_runs["stablelm"], out)
    done = hf.export_run(fast_runs["stablelm"], out, force=True)  # ... replaced by a StableLM one, nothing of it left
    assert done.format == "stablelm" and json.loads((out / "config.json").read_text())["model_type"] == "stablelm"
    assert not (out / "unrelated.txt").exists() and siblings(out) == []
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def crash(cfg, sd, folder, *args):  # the disk fills up half-way through the weights
        (folder / "model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf, "write_hf", crash)
    with pytest.raises(OSError, match="No space left"):
        hf.export_run(fast_runs["diff-interleaved-gqa"], out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and siblings(out) == []
    with pytest.raises(OSError):
        hf.export_run(fast_runs["diff-interleaved-gqa"], tmp_path / "new")
    assert siblings(out) == []  # neither `new` nor a temporary folder
