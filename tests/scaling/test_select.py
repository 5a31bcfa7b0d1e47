"""Best-of-grid selection, edge warnings, seed-paired gaps, reference baselines and the under-trained flag, on a
synthetic sweep whose losses the test chooses (and whose baselines the test computes on its own, from the trainer's
own loader) — through `collect`, `write_tables` and `fit_sweep` as `diffllm sweep collect` / `scaling fit` run them."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

import pytest

from diffllm.results import read_csv
from diffllm.scaling.baselines import BIGRAM_K
from diffllm.scaling.report import ScalingConfig, fit_sweep, render
from diffllm.scaling.select import select_runs, size_of
from diffllm.sweep.collect import collect, write_tables
from tests.distributed import cli_here
from tests.scaling.synthetic import expected_baselines, tokenizer, write_corpus, write_run

LRS = (0.001, 0.002, 0.004)
SIZES = ("micro-1", "micro-2", "micro-3")
SEEDS = (1, 2)
# series -> (arch, lambda_init, best lr per size); the loss is base + 0.05 * log2(lr / best)^2 + seed jitter
SERIES = {
    "transformer": ("transformer", None, {"micro-1": 0.002, "micro-2": 0.004, "micro-3": 0.002}),
    "diff λ_init=formula": ("diff", None, {"micro-1": 0.001, "micro-2": 0.002, "micro-3": 0.002}),
    "diff λ_init=0.8": ("diff", 0.8, {"micro-1": 0.002, "micro-2": 0.002, "micro-3": 0.002}),
}
UNDER_TRAINED = ("diff λ_init=formula", "micro-1")  # every lr there scores above the bigram


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    corpus = root / "corpus"
    write_corpus(corpus)
    tok = tokenizer(corpus)
    bigram = {s: expected_baselines(corpus, s, tok, BIGRAM_K) for s in SEEDS}
    losses = {}
    for series, (arch, lam, best) in SERIES.items():
        for i, size in enumerate(SIZES):
            for lr in LRS:
                for seed in SEEDS:
                    base = bigram[seed][1] - 1.0 + 0.3 / (i + 1) + (0.02 if arch == "diff" else 0.0) + 0.01 * seed
                    if (series, size) == UNDER_TRAINED:
                        base = bigram[seed][1] + 0.05
                    loss = base + 0.05 * ((lr / best[size]) ** 0.5 - 1) ** 2 * 10 + 0.003 * (lr == 0.001) * seed
                    labels = f"lr={lr:g}" + ("" if arch == "transformer" else f",lambda_init={lam}")
                    run = write_run(root / "runs", f"{arch}-{size}", seed, loss, tok, corpus, lr, lam, labels)
                    losses[str(run)] = (series, size, lr, seed, loss)
    return root, bigram, losses


def _best(losses):
    """(series, size) -> lr with the lowest mean loss over seeds, computed here from the chosen losses."""
    means = defaultdict(list)
    for series, size, lr, _seed, loss in losses.values():
        means[(series, size, lr)].append(loss)
    best = {}
    for (series, size, lr), ls in means.items():
        m = statistics.mean(ls)
        if (series, size) not in best or m < best[(series, size)][1]:
            best[(series, size)] = (lr, m)
    return {k: v[0] for k, v in best.items()}


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_collect_axes_baselines_selection(sweep, capsys):
    root, bigram, losses = sweep
    records = collect(root / "runs")
    assert len(records) == len(losses) == 54
    assert set(records[0].axes) == {"optim.lr", "model.lambda_init"}  # not seed, data.seed, run_dir, paths
    for r in records:
        seed = r.seed
        assert r.unigram_loss == pytest.approx(bigram[seed][0], rel=1e-12)
        assert r.bigram_loss == pytest.approx(bigram[seed][1], rel=1e-12)
        assert r.kn3_loss is not None and r.kn4_loss is not None
        series, size, lr, _, loss = losses[r.run_dir]
        assert r.axes["optim.lr"] == lr and r.under_trained == ((series, size) == UNDER_TRAINED)
    best = _best(losses)
    for r in records:
        series, size, lr, _, _ = losses[r.run_dir]
        assert r.selected == (lr == best[(series, size)])
    assert len(list((root / "runs" / ".baselines").glob("*.json"))) == 2  # one per data seed
    csv_path, md_path = write_tables(records, root / "runs", root / "out")
    assert read_csv(csv_path) == records
    md = md_path.read_text()
    edges = sorted(k for k, lr in best.items() if lr in (min(LRS), max(LRS)))
    assert edges == [("diff λ_init=formula", "micro-1"), ("transformer", "micro-2")]
    err = capsys.readouterr().err
    for series, size in edges:
        line = (
            f"{series}, {size}, 640 tokens: the best optim.lr={best[(series, size)]:g} is at "
            f"the edge of the values tried (0.001, 0.002, 0.004): widen the grid"
        )
        assert f"WARNING: {line}" in md and f"warning: {line}" in err
    assert md.count("widen the grid") == 2
    assert "| seed | λ_init | lr |" in md and "(under-trained)" in md and "**0.004:" in md
    assert "| bigram_loss | kn3_loss | kn4_loss |" in md and "Kneser-Ney 3- and 4-gram" in md


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_fit_uses_selected_trained_runs_and_pairs_seeds(sweep):
    """Every selected run is fitted by default, under-trained ones too (dropping them selects on the outcome);
    exclude_undertrained=true leaves them out and fits.md then shows L(N) both ways."""
    root, bigram, losses = sweep
    cfg = ScalingConfig(sweep_dir=str(root / "runs"), reps=20, joint="none", select_protocol="same")
    result = fit_sweep(cfg, collect(cfg.sweep_dir))
    best = _best(losses)
    fitted = {(f.arch, f.points) for f in result["power_law"]}
    assert fitted == {("transformer", 6), ("diff λ_init=0.8", 6), ("diff λ_init=formula", 6)}
    assert result["fit_runs"] == 18 and result["runs"] == 54 and result["power_law_with_undertrained"] is None
    note = "2 selected run(s) do not beat the bigram baseline (under-trained), kept in"
    assert any(note in n for n in result["notes"])
    excluded = fit_sweep(
        ScalingConfig(
            sweep_dir=str(root / "runs"), reps=20, joint="none", exclude_undertrained=True, select_protocol="same"
        ),
        collect(cfg.sweep_dir),
    )
    # formula without micro-1: 4 points at 2 sizes, refused (L(N) needs 3 sizes)
    assert {(f.arch, f.points) for f in excluded["power_law"]} == {("transformer", 6), ("diff λ_init=0.8", 6)}
    assert "L(N) for diff λ_init=formula: no fit (refused: 4 points at 2 sizes" in "\n".join(excluded["notes"])
    assert excluded["fit_inputs"] == 16 and excluded["fit_runs"] == 12  # formula's 4 runs made no fit: not "fitted"
    kept = {(f.arch, f.points) for f in excluded["power_law_with_undertrained"]}
    assert kept == fitted
    assert any("left out of the fits (exclude_undertrained=true" in n for n in excluded["notes"])
    md = render(excluded)
    assert "The same L(N) with the under-trained runs kept" in md and "| diff λ_init=formula | 6 |" in md
    at = {(s, size, lr, seed): loss for s, size, lr, seed, loss in losses.values()}
    gaps = {(g["series"], g["size"]): g for g in result["gaps"]}
    assert len(gaps) == 6 and {g["baseline"] for g in gaps.values()} == {"transformer"}
    for (series, size), g in gaps.items():
        per_seed = [
            at[(series, size, best[(series, size)], s)] - at[("transformer", size, best[("transformer", size)], s)]
            for s in SEEDS
        ]
        assert g["seeds"] == list(SEEDS) and g["gaps"] == pytest.approx(per_seed, abs=1e-12)
        assert g["mean"] == pytest.approx(statistics.mean(per_seed), abs=1e-12)
        assert g["std"] == pytest.approx(statistics.stdev(per_seed), abs=1e-12)
        assert (g["min"], g["max"]) == pytest.approx((min(per_seed), max(per_seed)), abs=1e-12)
        half = 6.313752 * statistics.stdev(per_seed) / 2**0.5  # Student t, 1 df, two-sided 90% (a table's value)
        assert (g["low"], g["high"]) == pytest.approx((g["mean"] - half, g["mean"] + half), abs=1e-6)
    md = render(result)
    assert "Paired gaps" in md and "| diff λ_init=0.8 | transformer | micro-2 | 640 | 2 |" in md
    assert "widen the grid" in md and "bigram p(b|a)" in md
    excluded_cfg = ScalingConfig(
        sweep_dir=str(root / "runs"), reps=20, joint="none", exclude_undertrained=True, select_protocol="same"
    )
    records = [
        r for r in collect(cfg.sweep_dir) if not (r.model == "diff-micro-3" and r.axes["model.lambda_init"] is None)
    ]
    short = fit_sweep(excluded_cfg, records)  # formula: micro-1 under-trained, micro-3 gone: 2 points at one size
    assert "diff λ_init=formula" not in {f.arch for f in short["power_law"]}
    assert any(
        n.startswith("L(N) for diff λ_init=formula: no fit (refused: 2 points at 1 sizes") for n in short["notes"]
    )


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_without_selection_every_lr_is_its_own_series(sweep):
    root, _, _ = sweep
    sel = select_runs(collect(root / "runs", baselines=False), select=None)
    assert len(set(sel.series.values())) == 9 and "transformer lr=0.002" in sel.series.values()
    assert "diff λ_init=0.8 lr=0.004" in sel.series.values() and not sel.warnings
    with pytest.raises(
        ValueError, match=r"select=optim\.lrr: no run's config has this key \(did you mean optim\.lr\?\)"
    ):
        select_runs(collect(root / "runs", baselines=False), select="optim.lrr")


@pytest.mark.slow
def test_scaling_fit_cli_prints_warnings(sweep):
    root, _, _ = sweep
    out = cli_here("scaling", "fit", f"sweep_dir={root}/runs", "reps=20", "joint=none", f"out={root}/fit")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("widen the grid") == 2 and "under-trained" in out.stderr
    fits = json.loads((root / "fit" / "fits.json").read_text())
    assert fits["selection"]["select"] == "optim.lr" and len(fits["gaps"]) == 6
    assert fits["selection"]["protocol"]["mode"] == "split"  # the default with 2 seeds: seed 1 selects, 2 reports
    assert all(g["seeds"] == [2] for g in fits["gaps"])
    assert "Selection of optim.lr: protocol split: chosen on seed(s) 1, reported on seed(s) 2 only." in out.stdout
    swapped = cli_here(
        "sweep", "collect", f"sweep_dir={root}/runs", f"out={root}/swapped", "select_seeds=[2]", "report_seeds=[1]"
    )
    assert swapped.returncode == 0, swapped.stderr
    md = (root / "swapped" / "runs.md").read_text()
    assert "protocol split: chosen on seed(s) 2, reported on seed(s) 1 only" in md
    rows = [r for r in read_csv(root / "swapped" / "runs.csv") if r.selected]
    assert len(rows) == 9 and {r.seed for r in rows} == {1}  # one reported run per (series, size)


def test_size_pairs_presets_by_their_size_base(tmp_path, monkeypatch):
    """The size is the preset's size/<size> base, so a user preset with another name pairs with the packaged one."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "my-diff-2.yaml").write_text(
        "defaults:\n  - arch/diff@_here_\n  - size/micro-2@_here_\n  - _self_\nname: my-diff-2\n"
    )
    monkeypatch.setenv("DIFFLLM_CONFIG_PATH", str(tmp_path))
    assert size_of("my-diff-2", "diff") == size_of("transformer-micro-2", "transformer") == "micro-2"
    assert size_of("diff-nopreset-9", "diff") == "nopreset-9" and size_of("odd", "diff") == "odd"


def _recall_record(arch: str, seed: int, lr: float, loss: float, acc: float):
    from diffllm.results import RunRecord

    return RunRecord(
        run_dir=f"/runs/{arch}/{lr}/seed{seed}",
        model=f"{arch}-micro-2",
        arch=arch,
        seed=seed,
        total_params=1,
        nonembedding_params=1,
        block_params=1,
        tokens=1000,
        flops=1.0,
        final_train_loss=loss,
        final_val_loss=loss,
        wall_time_s=1.0,
        world_size=1,
        status="finished",
        axes={"optim.lr": lr},
        recall_acc=acc,
    )


def test_select_by_recall_takes_the_highest_mean_accuracy():
    """By loss the lowest mean loss wins (lr 0.004); by recall_acc the highest mean accuracy (lr 0.001: 0.7 against
    0.55 and 0.35, though its loss is the worst), and the table says which metric and which way."""
    from diffllm.scaling.select import choices_markdown, selection_dict

    table = {0.001: (2.0, (0.8, 0.6)), 0.002: (1.9, (0.5, 0.6)), 0.004: (1.8, (0.3, 0.4))}
    records = [
        _recall_record("transformer", seed, lr, loss, accs[seed - 1])
        for lr, (loss, accs) in table.items()
        for seed in (1, 2)
    ]
    by_loss = select_runs(records, "optim.lr")
    by_recall = select_runs(records, "optim.lr", by="recall_acc")
    assert [c.value for c in by_loss.choices] == [0.004] and [c.value for c in by_recall.choices] == [0.001]
    assert by_recall.choices[0].means == pytest.approx((0.7, 0.55, 0.35))
    assert by_recall.selected == {r.run_dir for r in records if r.axes["optim.lr"] == 0.001}
    assert by_recall.warnings and "the best optim.lr=0.001 is at the edge" in by_recall.warnings[0]
    md = "\n".join(choices_markdown(selection_dict(by_recall)))
    assert "mean recall_acc over seeds" in md and "the highest selected" in md and "**0.001: 0.7000**" in md


@pytest.mark.slow  # > 5 s: make test-slow (make test stays under 8 min)
def test_select_by_a_typo_is_one_line_with_a_suggestion(sweep):
    root, _, _ = sweep
    with pytest.raises(
        ValueError,
        match=r"select_by=recal_acc: expected one of final_val_loss, final_train_loss, "
        r"recall_acc \(did you mean recall_acc\?\)",
    ):
        collect(root / "runs", baselines=False, by="recal_acc")
    out = cli_here("sweep", "collect", f"sweep_dir={root / 'runs'}", "select_by=recal_acc")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "select_by=recal_acc: expected one of" in out.stderr.strip().splitlines()[-1]


def test_the_under_trained_note_names_each_run_once_with_its_budgets():
    """A WSD-branch sweep has several budgets per (series, size, seed): the note named "diff micro-1 seed 1" once per
    budget without the budget (issue 56). Each is named once, with the budgets that are under-trained."""
    from diffllm.results import RunRecord
    from diffllm.scaling.select import Selection, under_trained_note

    def run(seed: int, tokens: int, under: bool = True) -> RunRecord:
        return RunRecord(
            f"runs/diff-micro-1/{tokens}/seed{seed}", "diff-micro-1", "diff", seed, 1, 1, 1, tokens, None, None, 5.0,
            None, 1, "finished", under_trained=under,
        )  # fmt: skip

    runs = [run(1, t) for t in (1536000, 384000, 768000)] + [run(2, 384000), run(2, 768000, under=False)]
    sel = Selection(None, series={r.run_dir: "diff" for r in runs}, selected={r.run_dir for r in runs})
    assert under_trained_note(runs, sel, exclude=False) == (
        "4 selected run(s) do not beat the bigram baseline (under-trained), kept in the fits (every run is reported; "
        "exclude_undertrained=true leaves them out): diff micro-1 seed 1 at 384,000, 768,000, 1,536,000 tokens; "
        "diff micro-1 seed 2 at 384,000 tokens"
    )
