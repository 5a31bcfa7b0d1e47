"""eval compare: one row per run, each cell the value its command wrote; missing results are blank or computed."""

from __future__ import annotations

import json
import shutil

import pytest

from diffllm.eval import attention, compare, needle, outliers, ppl


@pytest.mark.slow
def test_compare_table_holds_each_commands_numbers(runs, tmp_path, capsys):
    dirs = []
    for arch in ("transformer", "diff"):
        run = tmp_path / arch
        shutil.copytree(runs(arch), run)
        ppl.main([f"run={run}", "max_tokens=512"])
        needle.main([f"run={run}", "n_needles=[1,2]", "depths=[0,100]", "lengths=[64]", "trials=2"])
        outliers.main([f"run={run}", "tokens=256", "bits=[4]", "cloze_items=4"])
        dirs.append(str(run))
    attention.main([f"run={dirs[1]}", "depths=[50]", "length=64", "trials=1"])  # the transformer's stays missing
    compare.main([f"runs=[{dirs[0]},{dirs[1]}]", "compute=false", f"out={tmp_path / 'cmp'}"])
    lines = (tmp_path / "cmp" / "compare.md").read_text().splitlines()
    assert lines[0].startswith("| run | arch | step | loss | bits/byte | needle acc |") and len(lines) == 4
    for line, run in zip(lines[2:], dirs):
        cells = [c.strip() for c in line.strip("|").split("|")]
        p = json.loads((tmp_path / run / "eval" / "ppl.json").read_text())["sources"]["plays-heldout"]
        n = json.loads((tmp_path / run / "eval" / "needle-synthetic.json").read_text())
        o = json.loads((tmp_path / run / "eval" / "outliers.json").read_text())
        assert cells[1] == ("transformer" if "transformer" in run else "diff")
        assert float(cells[3]) == pytest.approx(p["loss"], rel=1e-2) and float(cells[5]) == pytest.approx(
            n["mean"], abs=1e-2
        )
        assert float(cells[6]) == pytest.approx(o["attention_logits"]["top1"], rel=1e-2)
        assert (cells[compare.HEADER.index("attention to answer")] == "nan") == ("transformer" in run)
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert cells[-3:] == [str(summary["spikes"]), str(summary["skipped_steps"]), f"{summary['max_grad_norm']:.3g}"]
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit):
        compare.main([f"runs=[{dirs[0]}]", "evals=[ppl,bleu]"])
    assert "evals: unknown 'bleu' (known: ppl, needle, outliers, attention)" in capsys.readouterr().err


def test_compare_says_what_it_computes_and_writes_beside_the_runs(runs, tmp_path, monkeypatch, capsys):
    """The missing evaluations are named (which, for which runs) before they run; the table goes to the runs'
    common parent folder, never the current one."""
    parent = tmp_path / "sweep"
    a, b = parent / "a", parent / "b"
    for run in (a, b):
        shutil.copytree(runs("transformer"), run, ignore=shutil.ignore_patterns("eval"))
    ppl.main([f"run={a}", "max_tokens=256"])
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    compare.main([f"runs=[{a},{b}]", "evals=[ppl]"])
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("| run |") and len(out.splitlines()) == 4  # not b's ppl table before it
    plan = next(line for line in err.splitlines() if "missing evaluation" in line)
    assert "computing 1 missing evaluation(s)" in plan and plan.endswith("ppl for b")
    assert err.index(plan) < err.index("b: computing ppl")  # said before it starts
    assert (parent / "compare" / "compare.md").is_file() and list(cwd.iterdir()) == []


def test_compare_shows_each_runs_stability_record_from_its_summary(tmp_path):
    """spikes, skipped steps and the max grad norm come from summary.json ("-" for a run without them)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "summary.json").write_text(json.dumps({"spikes": 3, "skipped_steps": 2, "max_grad_norm": 893.14}))
    (b / "summary.json").write_text(json.dumps({"tokens": 1}))  # a run from before spike detection
    results = compare.run_compare(compare.CompareConfig(runs=[str(a), str(b)], evals=[], out=str(tmp_path / "cmp")))
    assert results[str(a)]["training"] == {"spikes": 3, "skipped_steps": 2, "max_grad_norm": 893.14}
    lines = (tmp_path / "cmp" / "compare.md").read_text().splitlines()
    assert lines[0].endswith("| spikes | skipped steps | max grad norm |")
    assert lines[2].endswith("| 3 | 2 | 893 |") and lines[3].endswith("| - | - | - |")


def cli(*argv: str):
    """`diffllm eval compare <argv>`, in this process (its exit code, stdout and stderr)."""
    from tests.distributed import cli_here

    return cli_here("eval", "compare", *argv)


def sweep_run(folder, arch: str, steps: int):
    """A run directory as a sweep leaves it (config.yaml, summary.json), without eval results or checkpoints."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"model:\n  name: {arch}-micro-1\n  arch: {arch}\n")
    (folder / "summary.json").write_text(json.dumps({"arch": arch, "steps": steps, "spikes": 0}))
    return folder


def table_rows(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    assert lines[0].startswith("| run | arch | step |") and lines[1].startswith("|---|")  # stdout is the table alone
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_an_unquoted_list_of_sweep_runs_keeps_their_commas_and_labels_each_below_the_common_folder(tmp_path):
    """`runs=[.../lr=0.008,lambda_init=0.8/seed1,...]` typed unquoted is split at every comma: the pieces that join into
    a run directory are one run again (a glob names runs too). Each row is labelled by its path below the runs' common
    folder, arch and step come from config.yaml and summary.json without results (compute=false), and with nothing
    to plot no compare.png is written."""
    sweep = tmp_path / "sweep" / "micro-1"
    a = sweep_run(sweep / "lr=0.008,lambda_init=0.8" / "seed1", "diff", 12)
    b = sweep_run(sweep / "lr=0.004,lambda_init=0.8" / "seed1", "transformer", 10)
    got = cli(f"runs=[{a},{b}]", "compute=false")
    assert got.returncode == 0, got.stderr
    rows = table_rows(got.stdout)
    assert [r[:3] for r in rows] == [
        ["lr=0.008,lambda_init=0.8/seed1", "diff", "12"],
        ["lr=0.004,lambda_init=0.8/seed1", "transformer", "10"],
    ]
    assert sorted(p.name for p in (sweep / "compare").iterdir()) == ["compare.json", "compare.md"]
    assert "no compare.png" in got.stderr
    assert table_rows(cli(f"runs={a},{b}", "compute=false").stdout) == rows  # without brackets: the same
    got = cli(f"runs={sweep}/*/seed1", "compute=false", "evals=[ppl]")  # a glob: its runs, sorted
    names = [r[0] for r in table_rows(got.stdout)]
    assert names == ["lr=0.004,lambda_init=0.8/seed1", "lr=0.008,lambda_init=0.8/seed1"]
    sweep_run(sweep / "lr=0.008", "diff", 1)  # now `lr=0.008` and `lr=0.008,lambda_init=0.8/seed1` both exist
    got = cli(f"runs=[{sweep}/lr=0.008,lambda_init=0.8/seed1]", "compute=false")
    assert got.returncode == 2 and got.stdout == "" and len(got.stderr.splitlines()) == 1
    assert f"'{sweep}/lr=0.008' and '{sweep}/lr=0.008,lambda_init=0.8/seed1' both name run directories" in got.stderr


def test_the_needle_panel_ticks_the_numbers_of_needles_and_the_legend_covers_no_panel():
    results = {
        f"s/lr=0.00{i},lambda_init=0.8/seed1": {"needle": {"by_n": {"1": 0.5, "2": 0.25, "4": 0.1}}} for i in range(4)
    }
    fig = compare.figure(results, {run: run[2:] for run in results})
    (ax,) = fig.axes  # no attention results: no empty attention panel
    assert list(ax.get_xticks()) == [1, 2, 4]  # not 1.5 needles
    assert ax.get_legend() is None and len(fig.legends) == 1  # one legend, below the panel
    assert compare.figure({"a": {"needle": None, "attention": None}}, {"a": "a"}) is None
