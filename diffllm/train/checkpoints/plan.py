"""Where a run continues from, and what it may not change: the `ResumePlan` of a launch, decided on every rank before
the engine is built, over the launch's `RunSnapshot` (snapshot.py: run_dir and the runs it names, read once before; the
plan never goes back to them): `plan_resume` decides trainer.resume against run_dir, a WSD branch's parent checkpoint
(`branch_source`, see branch.py), model.init_from, the tokenizer, a finished run and the ZeRO layout. The checks behind
it: the checkpoint's architecture and ZeRO layout, a finished run's config, a resumed run's budget (not below what it
trained) and optimisation schedule (changed only with trainer.allow_changes=true), a branch's config against its
parent's, the run's own tokenizer. Every check reads only, so all ranks reach the same verdict before rank 0 changes
anything (a finished run is never changed, at any world size); even a fresh start's old files are moved aside only
once every input is checked (`ResumePlan.fresh`, the Trainer's `begin`)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from ...budget import Budget
from ...counts import parse_count
from ...errors import UserError
from ...model import ModelConfig
from ...runs import Checkpoint, config_hash, tokenizer_choice
from ..dist import all_gather_object, barrier
from .branch import BranchPlan
from .snapshot import RunFiles, RunSnapshot, got

if TYPE_CHECKING:
    from ..config import TrainConfig, TrainerConfig
    from ..context import LaunchContext


def keys_with(cfg: Any, *roles: str, prefix: str = "") -> tuple[str, ...]:
    """The dotted keys of a config (a dataclass instance, nested ones walked) whose field metadata gives them one of
    `roles` (config.py ROLES): `keys_with(train_config, "operational")` -> ("trainer.resume", ..., "run_dir")."""
    out: list[str] = []
    for f in dataclasses.fields(cfg):
        key = f"{prefix}{f.name}"
        if set(f.metadata.get("resume", ())) & set(roles):
            out.append(key)
        elif dataclasses.is_dataclass(getattr(cfg, f.name)):
            out.extend(keys_with(getattr(cfg, f.name), *roles, prefix=f"{key}."))
    return tuple(out)


def resume_point(snap: RunSnapshot, mode: str) -> Optional[Checkpoint]:
    """The checkpoint this launch continues from (None: a fresh start).

    A checkpoint of another run (trainer.resume=<path> outside run_dir) starts a new run in run_dir, so run_dir must
    hold no run of its own: it is refused rather than mixed (its metrics, summary and checkpoints would interleave
    with the new run's). Relaunching that same command later continues run_dir's own checkpoints."""
    run, at = snap.run, snap.resume
    if mode == "none":
        return None
    if mode == "auto":
        return got(run.latest)
    if not at.exists:
        raise UserError(f"trainer.resume={mode}: no such checkpoint (use auto, none or a checkpoint path)")
    found = got(at.checkpoint)
    if found is None:
        raise UserError(f"trainer.resume={mode}: no `latest` file or meta.json there")
    if at.in_run_dir or not run.files:
        return found
    own = got(run.latest)
    if own is not None and ((got(run.config) or {}).get("trainer") or {}).get("resume") == mode:
        return own  # this run was started from `mode` by the same command: continue it
    have = ", ".join(run.files)
    raise UserError(
        f"trainer.resume={mode}: run_dir={run.dir} already holds another run ({have}); continuing a "
        f"checkpoint of another run there would mix the two: use a new run_dir (or move run_dir's files "
        f"away first)"
    )


def check_model(ckpt: Checkpoint, model_cfg: ModelConfig) -> None:
    """A checkpoint of another architecture is refused up front, naming the first differing key (the keys that are
    no architecture, roles kept and label, aside). A key the checkpoint lacks is one added to ModelConfig after it
    was saved, and reads as its default (a new key's default is the behaviour before it)."""
    saved, ours, runtime = (
        filled(ckpt.meta.get("model", {}), model_cfg),
        asdict(model_cfg),
        keys_with(model_cfg, "kept", "label"),
    )
    for key in sorted(set(saved) | set(ours)):
        if key not in runtime and saved.get(key) != ours.get(key):
            raise UserError(
                f"model.{key}: the checkpoint {ckpt.path} has {saved.get(key)!r}, this run "
                f"{ours.get(key)!r}; use another run_dir, or trainer.resume=none to start afresh"
            )


def check_pickles(ckpt: Checkpoint, rank: int) -> None:
    """Collective. Rank 0 scans the checkpoint's files for a pickle that would run code (Checkpoint.check_pickles:
    one read of each pickle, not of every file by every rank); its refusal is raised on every rank alike."""
    refusal = None
    if rank == 0:
        try:
            ckpt.check_pickles()
        except UserError as e:
            refusal = str(e)
    refusal = all_gather_object(refusal)[0]
    if refusal is not None:
        raise UserError(refusal)


def needs_universal(ckpt: Checkpoint, world_size: int, trainer: TrainerConfig) -> bool:
    """A different world size or ZeRO stage (trainer.zero_stage) loads through DeepSpeed's universal checkpoint (a
    ZeRO-0 checkpoint has no ZeRO shards to convert: it resumes only as it was saved)."""
    saved = (ckpt.meta["world_size"], ckpt.zero_stage)
    if saved == (world_size, trainer.zero_stage):
        return False
    if saved[1] == 0:
        raise UserError(
            f"trainer.zero_stage: {ckpt.path} was saved with ZeRO-0 on {saved[0]} rank(s), which cannot "
            f"be resharded; resume it with trainer.zero_stage=0 on {saved[0]} rank(s)"
        )
    return True


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def filled(saved: dict, cfg: Any) -> dict:
    """A config saved by an earlier diffllm with each key it lacks read as that key's default in `cfg`'s dataclasses
    (nested ones walked): a key added after the run was saved has the behaviour before it as its default, so it is
    no change (as check_model reads a checkpoint's model)."""
    out = dict(saved)
    for f in dataclasses.fields(cfg):
        value, old = getattr(cfg, f.name), saved.get(f.name)
        if dataclasses.is_dataclass(value) and (old is None or isinstance(old, dict)):
            out[f.name] = filled(old or {}, value)
        elif f.name not in saved and f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.name not in saved and f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def changed_keys(saved: dict, now: dict, ignore: tuple[str, ...]) -> list[str]:
    """`key (old -> new)` for every config key that differs, but those under `ignore`."""
    old, new = flatten(saved), flatten(now)
    skip = lambda k: any(k == i or k.startswith(i + ".") for i in ignore)  # noqa: E731
    return [
        f"{k} ({old.get(k)!r} -> {new.get(k)!r})"
        for k in sorted(set(old) | set(new))
        if not skip(k) and old.get(k) != new.get(k)
    ]


def check_finished_unchanged(run: RunFiles, saved_config: dict, cfg: TrainConfig) -> None:
    """A finished run's result is final: relaunching it with a different config (operational keys aside) is an
    error naming the keys."""
    changed = changed_keys(filled(saved_config, cfg), cfg.resolved, keys_with(cfg, "operational"))
    if changed:
        raise UserError(
            f"run_dir={run.dir} holds a finished run (summary.json) whose config differs: "
            f"{'; '.join(changed)}; its result is not rewritten: use another run_dir, or "
            f"trainer.resume=none to train afresh there"
        )


def check_within_budget(saved: dict, ckpt: Checkpoint, cfg: TrainConfig, budget: Budget) -> None:
    """A budget below what the checkpoint has trained cannot be kept (the run would finish past it): refused."""
    done = int(saved["train_state"]["tokens"])
    if done > budget.tokens:
        raise UserError(
            f"trainer.tokens={cfg.trainer.tokens}: a budget of {budget.tokens:,} tokens, below the {done:,} tokens "
            f"that the checkpoint {ckpt.path} has trained (step {ckpt.step}); use trainer.tokens={done} or more, or "
            f"trainer.resume=none to start afresh"
        )


def check_same_tokenizer(kept, configured_path: Optional[str], configured) -> None:
    """A tokenizer passed with data.tokenizer.path must be the one the run was trained with."""
    if configured is not None and configured.fingerprint != kept.fingerprint:
        raise UserError(
            f"data.tokenizer.path={configured_path}: not the tokenizer this run was trained with "
            f"({kept.origin}, vocab {kept.vocab_size}); a resumed run keeps its own tokenizer: drop "
            f"data.tokenizer.path, or use another run_dir"
        )


SCHEDULE = ("optim", "trainer.tokens", "trainer.global_batch_tokens")  # a run's optimisation schedule
COUNTS = ("trainer.tokens", "trainer.global_batch_tokens")  # compared as numbers: 16K is 16384


def schedule_changes(saved: dict, now: dict, at_budget: bool) -> list[str]:
    """`key (old -> new)` for each key of the optimisation schedule (SCHEDULE) that differs from the checkpoint's
    config (a key its diffllm did not have yet aside). `at_budget`: the checkpoint reached its own budget (a finished
    run): a larger trainer.tokens trains on, which is no change."""
    old, new = flatten(saved), flatten(now)
    out = []
    for k in sorted(k for k in old if k in new and any(k == s or k.startswith(s + ".") for s in SCHEDULE)):
        a, b = old[k], new[k]
        if k in COUNTS:
            a_n, b_n = parse_count(a, k), parse_count(b, k)
            if a_n == b_n or (k == "trainer.tokens" and at_budget and b_n > a_n):
                continue
        elif a == b:
            continue
        out.append(f"{k} ({a!r} -> {b!r})")
    return out


def check_changes(saved: dict, ckpt: Checkpoint, cfg: TrainConfig, say: Callable[[str], None]) -> None:
    """A resumed run keeps its optimisation schedule: a change is refused in one line naming the keys, unless
    trainer.allow_changes=true (then each is a note). Another data config is a note."""
    sched = saved.get("schedule") or {}
    at_budget = "total_steps" in sched and sched.get("step", 0) >= sched["total_steps"]
    changed = schedule_changes(filled(saved["config"], cfg), cfg.resolved, at_budget)
    if changed and not cfg.trainer.allow_changes:
        raise UserError(
            f"{'; '.join(changed)}: changed since the checkpoint {ckpt.path}; a resumed run keeps its optimisation "
            f"schedule: relaunch with the checkpoint's values, or add trainer.allow_changes=true to continue with the "
            f"new ones"
        )
    for change in changed:
        say(f"note: {change} since the checkpoint (trainer.allow_changes=true): the run continues with the new value")
    old, new = (saved["config"].get("data") or {}).get("name"), cfg.data.name
    if old != new:
        say(f"note: data.name changed since the checkpoint ({old} -> {new}); the run continues with {new}")


def check_prefix(parent: dict, cfg: TrainConfig, src: str) -> None:
    """The first config key (sorted) that differs from the parent's, the keys a branch may set otherwise (roles
    operational and branch: they change neither what was computed before the branch point nor how) aside: a one-line
    error."""
    free = keys_with(cfg, "operational", "branch")
    if cfg.model.init_from is None:  # the vocabulary is the tokenizer's (plan_resume), compared as data.tokenizer
        free += ("model.vocab_size",)
    changed = changed_keys(filled(parent, cfg), cfg.resolved, free)
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise UserError(
            f"trainer.branch_from={src}: {changed[0]} differs from the parent run's config{more}; a "
            f"branch shares its parent's schedule, data and model up to the branch point: use the "
            f"parent's value, or train from scratch"
        )


def branch_source(
    cfg: TrainConfig, snap: RunSnapshot, own: Optional[Checkpoint], budget: Budget, step: int
) -> tuple[Optional[Checkpoint], Optional[dict]]:
    """Where a launch with trainer.branch_from starts -> (checkpoint, branch record). `own`: run_dir's latest
    checkpoint (trainer.resume=auto): a relaunched branch resumes it (record None). Otherwise the parent's
    checkpoint at `step` = S(budget.steps) (budget.plan_branching) and the record for branch.json: parent, step,
    tokens, parent_config_hash."""
    src, run = cfg.trainer.branch_from, snap.run
    parent = got(snap.parent)
    if own is not None:
        kept = got(run.branch)
        if kept is None or Path(kept["parent"]).resolve() != parent.resolved:
            raise UserError(
                f"trainer.branch_from={src}: run_dir={run.dir} already holds another run ("
                f"{'a branch of ' + kept['parent'] if kept else 'not a branch'}); use a new run_dir"
            )
        return own, None
    if parent.resolved == run.resolved:
        raise UserError(
            f"trainer.branch_from={src}: the branch's own run_dir; a branch is its own run: use another run_dir"
        )
    pconf = got(parent.config) if parent.is_dir else None
    if pconf is None:
        raise UserError(
            f"trainer.branch_from={src}: not a run directory (no config.yaml); pass the run_dir of a WSD run"
        )
    if (pconf.get("trainer") or {}).get("branch_from"):
        raise UserError(
            f"trainer.branch_from={src}: a branch itself (of {pconf['trainer']['branch_from']}); branch from that run"
        )
    if cfg.optim.schedule != "wsd":
        raise UserError(f"trainer.branch_from={src}: needs optim.schedule=wsd (got {cfg.optim.schedule})")
    check_prefix(pconf, cfg, src)
    steps, batch = budget.steps, budget.global_batch_tokens
    parent_steps = -(-parse_count(pconf["trainer"]["tokens"], "trainer.tokens") // batch)
    if steps > parent_steps:
        raise UserError(
            f"trainer.tokens={cfg.trainer.tokens}: beyond the budget of trainer.branch_from={src} "
            f"({steps} > {parent_steps} steps); a branch decays before its parent does"
        )
    if step not in parent.checkpoints:
        have = ", ".join(map(str, parent.checkpoints)) or "none"
        raise UserError(
            f"trainer.branch_from={src}: no checkpoint at step {step}, where a budget of "
            f"{steps * batch} tokens begins to decay (its checkpoints: steps {have}); train the parent "
            f"with {steps * batch} in trainer.branch_budgets"
        )
    record = {
        "parent": str(parent.resolved),
        "step": step,
        "tokens": step * batch,
        "parent_tokens": parent_steps * batch,
        "parent_config_hash": config_hash(pconf),
    }
    return got(parent.checkpoints[step]), record


@dataclass(frozen=True)
class ResumePlan:
    """Where this launch starts, decided on every rank alike before the engine is built."""

    config: TrainConfig  # what is trained: the launch's config with what resume decided (vocabulary, init_from)
    checkpoint: Optional[Checkpoint]  # the checkpoint to load; None: a fresh start at step 0
    universal: bool  # load it through DeepSpeed's universal format (the world size or ZeRO stage changed)
    weights: Optional[dict]  # model.init_from on a new run: its weights
    tokenizer: Any  # diffllm.data.Tokenizer
    branches: BranchPlan  # the run's WSD branching: checkpoints kept for branches; a branch's start from its parent
    saved: Optional[dict] = None  # the checkpoint's resumable state (Resumable.saved), read before any engine exists
    finished: bool = False  # run_dir holds a finished run at this budget: nothing is built, loaded or written
    fresh: Optional[str] = None  # a new run in run_dir: why its old files are moved aside (once every input is checked)


def plan_resume(cfg: TrainConfig, snap: RunSnapshot, ctx: LaunchContext) -> ResumePlan:
    """The launch's plan for its budget (`ctx`: budget, branching, rank, world size) over `snap`; it writes nothing
    and reads no file of the run directory again: besides the snapshot it loads only what it decided on
    (model.init_from's weights, the tokenizer, the checkpoint's resumable state). A fresh start's old files are not
    looked at (its tokenizer, its config): they are moved aside later, once every input is checked (`fresh` says why).
    Whether a resumed run is finished (then its config must be unchanged) is decided from its summary.json and
    checkpoint. The plan's `config` is `cfg` as trained (init_from's architecture, name and tokenizer, the tokenizer's
    vocabulary): a new TrainConfig, whose `resolved` is what config.yaml and the checkpoints record."""
    from .state import Resumable

    mode, budget, say = cfg.trainer.resume, ctx.budget, ctx.say
    ckpt, source = resume_point(snap, mode), None
    if cfg.trainer.branch_from:  # a relaunched branch resumes its own checkpoint, a new one its parent's
        ckpt, source = branch_source(cfg, snap, ckpt, budget, ctx.branching.start)
    fresh = None  # a new run: why run_dir's old files (if any) are moved aside
    if source is not None:
        fresh = "a new branch"
    elif ckpt is None:
        fresh = "trainer.resume=none" if mode == "none" else "no checkpoint to resume from"
    cfg, weights = init_from(cfg, ckpt)
    owners = ([] if fresh is not None else [snap.run.tokenizer]) + ([snap.tokenizers[ckpt.dir]] if ckpt else [])
    tok_file, kept = tokenizer_choice(  # runs.choose_tokenizer's decision, over the snapshot
        [p for p in owners if p is not None],
        cfg.data.tokenizer.path,
        lambda: got(snap.init_tokenizer) if weights is not None else None,
    )
    if weights is not None:
        cfg = init_tokenizer(cfg, tok_file, say)
    tok = tokenizer(cfg, snap, tok_file if kept else None, ctx.rank, fresh is not None)
    if cfg.model.init_from is None:
        cfg = replace(cfg, model=replace(cfg.model, vocab_size=tok.vocab_size))
    elif tok.vocab_size > cfg.model.padded_vocab_size:
        raise UserError(
            f"model.init_from={cfg.model.init_from}: its embedding has {cfg.model.padded_vocab_size} "
            f"rows, the tokenizer {tok.vocab_size} tokens; use its own tokenizer (data.tokenizer.path)"
        )
    plan = ResumePlan(cfg, ckpt, False, weights, tok, BranchPlan(ctx.branching.points, source), fresh=fresh)
    if ckpt is None:
        return plan
    check_model(ckpt, cfg.model)
    check_pickles(ckpt, ctx.rank)  # a file that would run code: refused on every rank before DeepSpeed loads it
    saved = Resumable.saved(ckpt.client_state())
    if saved is None:
        raise UserError(
            f"{ckpt.path}: model weights without a training state (a `diffllm import`); start a new run "
            f"from them with model.init_from={ckpt.dir.parent} and another run_dir"
        )
    if got(snap.run.finished) and ckpt.step >= budget.steps:
        check_finished_unchanged(snap.run, saved["config"], cfg)
        return replace(plan, saved=saved, finished=True)
    check_within_budget(saved, ckpt, cfg, budget)
    if source is None:  # a branch's start is checked against its parent's config (check_prefix)
        check_changes(saved, ckpt, cfg, say)
    return replace(plan, universal=needs_universal(ckpt, ctx.world_size, cfg.trainer), saved=saved)


def init_from(cfg: TrainConfig, ckpt: Optional[Checkpoint]) -> tuple[TrainConfig, Optional[dict]]:
    """model.init_from -> (the config with the pretrained architecture, its weights or None): the architecture (all
    but the kept keys) and name are the pretrained model's; a new run also takes its weights (and its tokenizer:
    `init_tokenizer`). A relaunch resumes its own checkpoints as any run does."""
    src = cfg.model.init_from
    if not src:
        return cfg, None
    from ...export import load_pretrained

    kept = {k: getattr(cfg.model, k) for k in keys_with(cfg.model, "kept")}
    if ckpt is not None:
        return replace(cfg, model=ModelConfig(**{**ckpt.meta["model"], **kept})), None
    pretrained, weights = load_pretrained(src)
    return replace(cfg, model=replace(pretrained, **kept)), weights  # its name too: not the preset's in summaries


def init_tokenizer(cfg: TrainConfig, tok_file: Optional[Path], say: Callable[[str], None]) -> TrainConfig:
    """A new run from model.init_from takes `tok_file` (its tokenizer, unless data.tokenizer.path is set), and says
    what it took."""
    data, m = cfg.data, cfg.model
    if data.tokenizer.path is None and tok_file is not None:
        data = replace(data, tokenizer=replace(data.tokenizer, path=str(tok_file)))
    say(
        f"model.init_from={m.init_from}: {m.arch}, {m.n_layers} layers, d_model {m.d_model}, vocab "
        f"{m.padded_vocab_size}; its weights, a fresh optimizer at step 0; tokenizer {data.tokenizer.path}"
    )
    return replace(cfg, data=data)


def tokenizer(cfg: TrainConfig, snap: RunSnapshot, kept: Optional[Path], rank: int, fresh: bool):
    """The run's tokenizer: a `kept` one (runs.choose_tokenizer's decision: run_dir's own, unless `fresh`, or the
    checkpoint's run's) is loaded and checked against the config (a changed data.tokenizer setting or another
    data.tokenizer.path is refused); otherwise the configured one (the default BPE: trained once, by rank 0, and
    cached)."""
    from ...data import ensure_tokenizer, load_tokenizer

    tok_cfg = cfg.data.tokenizer
    if kept is not None:
        saved = None if fresh else ((got(snap.run.config) or {}).get("data") or {}).get("tokenizer")
        now = asdict(tok_cfg)
        changed = changed_keys(saved, now, ignore=keys_with(tok_cfg, "operational")) if saved else []
        if changed:
            raise UserError(
                f"data.tokenizer: this run was trained with another tokenizer ({'; '.join(changed)}); "
                f"a resumed run keeps its own {kept}: use another run_dir for a new tokenizer"
            )
        tok = load_tokenizer(str(kept), tok_cfg.eos_token)
        check_same_tokenizer(
            tok,
            tok_cfg.path,
            load_tokenizer(tok_cfg.path, tok_cfg.eos_token)
            if tok_cfg.path and Path(tok_cfg.path).resolve() != kept.resolve()
            else None,
        )
        return tok
    if rank == 0:
        tok = ensure_tokenizer(cfg.data)
    barrier()
    return tok if rank == 0 else ensure_tokenizer(cfg.data)
