"""Where a run continues from, and what it may not change: trainer.resume (auto | none | a checkpoint path) against
the run directory's contents, the checkpoint's architecture and ZeRO layout, a finished run's config, and the run's
own tokenizer. Every check here reads only, so all ranks reach the same verdict before rank 0 changes anything."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from ..runs import Checkpoint, Run, find_checkpoint

# Keys that change how a run is executed or logged, not what it computes: a finished run may be relaunched with
# other values. (trainer.tokens is compared: a larger budget continues the run, see Trainer.load.)
OPERATIONAL = ("run_dir", "trainer.resume", "trainer.log_every", "trainer.save_every_steps",
               "trainer.save_every_minutes", "trainer.keep_last", "trainer.dist_timeout_minutes",
               "trainer.round_tokens", "trainer.eval", "trainer.stall_timeout_s", "trainer.inject_stall_at_steps",
               "trainer.inject_step_delay_s",
               "trainer.val_batch_size", "trainer.compile", "trainer.activation_checkpointing", "model.attn_backend",
               "data.num_workers", "data.worker_timeout_s", "data.tokenizer.path", "logging")


def resume_point(run: Run, mode: str) -> Optional[Checkpoint]:
    """The checkpoint this launch continues from (None: a fresh start).

    A checkpoint of another run (trainer.resume=<path> outside run_dir) starts a new run in run_dir, so run_dir must
    hold no run of its own: it is refused rather than mixed (its metrics, summary and checkpoints would interleave
    with the new run's). Relaunching that same command later continues run_dir's own checkpoints."""
    if mode == "none":
        return None
    if mode == "auto":
        return run.latest()
    path = Path(mode)
    if not path.exists():
        raise ValueError(f"trainer.resume={mode}: no such checkpoint (use auto, none or a checkpoint path)")
    found = find_checkpoint(path)
    if found is None:
        raise ValueError(f"trainer.resume={mode}: no `latest` file or meta.json there")
    if found.dir.resolve() == run.checkpoints_dir.resolve() or not run.files():
        return found
    own = run.latest()
    if own is not None and ((run.config() or {}).get("trainer") or {}).get("resume") == mode:
        return own  # this run was started from `mode` by the same command: continue it
    have = ", ".join(p.name for p in run.files())
    raise ValueError(f"trainer.resume={mode}: run_dir={run.dir} already holds another run ({have}); continuing a "
                     f"checkpoint of another run there would mix the two: use a new run_dir (or move run_dir's files "
                     f"away first)")


RUNTIME_KEYS = ("name", "attn_backend", "max_seq_len", "init_from")  # model keys that are not the architecture


def check_model(ckpt: Checkpoint, model_cfg) -> None:
    """A checkpoint of another architecture is refused up front, naming the first differing key."""
    saved, ours = ckpt.meta.get("model", {}), asdict(model_cfg)
    for key in sorted(set(saved) | set(ours)):
        if key not in RUNTIME_KEYS and saved.get(key) != ours.get(key):
            raise ValueError(f"model.{key}: the checkpoint {ckpt.path} has {saved.get(key)!r}, this run "
                             f"{ours.get(key)!r}; use another run_dir, or trainer.resume=none to start afresh")


def needs_universal(ckpt: Checkpoint, world_size: int, zero_stage: int) -> bool:
    """A different world size or ZeRO stage loads through DeepSpeed's universal checkpoint (a ZeRO-0 checkpoint has
    no ZeRO shards to convert: it resumes only as it was saved)."""
    saved = (ckpt.meta["world_size"], ckpt.zero_stage)
    if saved == (world_size, zero_stage):
        return False
    if saved[1] == 0:
        raise ValueError(f"trainer.zero_stage: {ckpt.path} was saved with ZeRO-0 on {saved[0]} rank(s), which cannot "
                         f"be resharded; resume it with trainer.zero_stage=0 on {saved[0]} rank(s)")
    return True


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def changed_keys(saved: dict, now: dict, ignore: tuple[str, ...] = OPERATIONAL) -> list[str]:
    """`key (old -> new)` for every config key that differs, but those under `ignore`."""
    old, new = flatten(saved), flatten(now)
    skip = lambda k: any(k == i or k.startswith(i + ".") for i in ignore)  # noqa: E731
    return [f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in sorted(set(old) | set(new))
            if not skip(k) and old.get(k) != new.get(k)]


def check_finished_unchanged(run: Run, saved_config: dict, config: dict) -> None:
    """A finished run's result is final: relaunching it with a different config is an error naming the keys."""
    changed = changed_keys(saved_config, config)
    if changed:
        raise ValueError(f"run_dir={run.dir} holds a finished run (summary.json) whose config differs: "
                         f"{'; '.join(changed)}; its result is not rewritten: use another run_dir, or "
                         f"trainer.resume=none to train afresh there")


def run_tokenizer_file(run: Run, ckpt: Optional[Checkpoint]) -> Optional[Path]:
    """The tokenizer.json a resumed run must keep: its own, or (a new run from another run's checkpoint) that run's."""
    if ckpt is None:
        return None
    for owner in (run, Run(ckpt.dir.parent)):
        path = owner.dir / "tokenizer.json"
        if path.is_file():
            return path
    return None


def check_same_tokenizer(kept, configured_path: Optional[str], configured) -> None:
    """A tokenizer passed with data.tokenizer.path must be the one the run was trained with."""
    if configured is not None and configured.fingerprint != kept.fingerprint:
        raise ValueError(f"data.tokenizer.path={configured_path}: not the tokenizer this run was trained with "
                         f"({kept.origin}, vocab {kept.vocab_size}); a resumed run keeps its own tokenizer: drop "
                         f"data.tokenizer.path, or use another run_dir")
