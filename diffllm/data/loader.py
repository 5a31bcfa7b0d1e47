"""The training loader (rank x DataLoader-worker slots over packed streams, exact resumable state) and validation.

Layout: N streams (data.num_streams, default world_size x workers) each read a disjoint share of every source.
Slot g = rank * workers + worker serves streams g, g+S, g+2S, ... (S = world_size x workers), one micro-batch at a
time, round-robin. A stream's state is global (it does not depend on who reads it), so a run resumes exactly on any
layout whose slot count divides N; other layouts are refused with what to do."""

from __future__ import annotations

import atexit
import dataclasses
import os
import weakref
from typing import Iterator, Optional

import numpy as np
import torch

from . import workers
from .batch import Batch
from .config import DataConfig, DataError
from .packing import COUNTS
from .sources import Source, resolve
from .stream import Stream, data_fingerprint
from .tokenizer import Tokenizer, say

STATE_VERSION = 1


def resolve_sources(cfg: DataConfig, val: bool = False) -> list[Source]:
    """The training sources, or the held-out ones (val=True): data.val, or with data.val_fraction the training
    sources themselves (whose streams then read only their held-out documents)."""
    nodes, key = (cfg.val, "data.val") if val and not cfg.holds_out else (cfg.sources, "data.sources")
    if not nodes:
        hint = "held-out source, or set data.val_fraction (e.g. 0.01)" if val else "training source"
        raise DataError(f"{key}: empty; configure at least one {hint}")
    return [resolve(s, f"{key}[{i}]", cfg.prepared_dir) for i, s in enumerate(nodes)]


_LIVE: weakref.WeakSet[TrainLoader] = weakref.WeakSet()


@atexit.register  # runs before multiprocessing's exit hook, which would SIGTERM (ignored) and then wait on workers
def _close_live_loaders() -> None:
    for loader in list(_LIVE):
        loader.close()


class _Slots(torch.utils.data.IterableDataset):
    """What worker w runs: slot `slots[w]`, its streams round-robin, yielding (slot, batch, update) tuples, the batch
    a numpy array (micro_batch_size, 3, seq_len + 1) int32 of packed windows (diffllm.data.batch), sent by value
    (see workers.as_is).
    Errors travel as ("error", message) so the training process re-raises them as one-line DataErrors."""

    def __init__(self, loader: TrainLoader, slots: list[int]):
        self.sources, self.tok, self.cfg = loader.sources, loader.tok, loader.cfg
        self.n, self.micro = loader.n_streams, loader.micro_batch_size
        self.slots = slots
        self.streams = {g: [(s, loader.stream_states.get(s)) for s in loader.streams_of(g)] for g in slots}
        self.turns = {g: loader.turns.get(g, 0) for g in slots}

    def __iter__(self) -> Iterator[tuple]:
        info = torch.utils.data.get_worker_info()
        g = self.slots[info.id if info else 0]
        try:
            streams = [
                Stream(self.sources, self.tok, self.cfg, s, self.n, st, epochs=self.cfg.epochs)
                for s, st in self.streams[g]
            ]
            turn = self.turns[g]
            while True:
                stream = streams[turn]
                try:
                    batch = np.stack([stream.next_window() for _ in range(self.micro)])
                except StopIteration:  # finite epochs only: the last partial micro-batch is dropped
                    return
                turn = (turn + 1) % len(streams)
                yield g, batch, {"stream": stream.index, "state": stream.state(), "turn": turn}
        except DataError as e:
            yield "error", str(e), None


class TrainLoader:
    """Micro-batches (a Batch of micro_batch_size windows of seq_len + 1 tokens, with the document ids and loss mask
    the data config asks for) of this rank, forever; `state_dict`/`load_state_dict` resume it. pin_memory: each
    Batch in pinned host memory, for a CUDA device to copy without the host waiting (only where CUDA is there:
    pinning raises on a CPU-only build). The batch is pinned here as it is built, not by DataLoader(pin_memory=True):
    workers send numpy arrays by value (workers.as_is), which DataLoader's pin thread would leave unpinned."""

    def __init__(
        self,
        cfg: DataConfig,
        tok: Tokenizer,
        rank: int,
        world_size: int,
        micro_batch_size: int,
        pin_memory: bool = False,
    ):
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} is outside world_size {world_size}")
        if micro_batch_size < 1:
            raise DataError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.cfg, self.tok, self.rank, self.world_size, self.micro_batch_size = (
            cfg,
            tok,
            rank,
            world_size,
            micro_batch_size,
        )
        self.sources = resolve_sources(cfg)
        self.fingerprint = data_fingerprint(
            self.sources, tok, f"val_fraction={cfg.val_fraction}" if cfg.holds_out else ""
        )
        self.workers = max(1, cfg.num_workers)
        self.n_slots = world_size * self.workers
        self.n_streams = cfg.num_streams or self.n_slots
        if self.n_streams % self.n_slots:
            raise DataError(
                f"data.num_streams={self.n_streams} must be a multiple of world_size x workers = "
                f"{world_size} x {self.workers} = {self.n_slots}"
            )
        self.pin_memory = pin_memory
        self.stream_states: dict[int, Optional[dict]] = {}
        self.turns: dict[int, int] = {}
        self.next_worker = 0  # which of this rank's slots delivers the next micro-batch
        self.batches = 0
        self._it: Optional[Iterator] = None
        _LIVE.add(self)

    # layout
    def slots(self) -> list[int]:
        return [self.rank * self.workers + w for w in range(self.workers)]

    def streams_of(self, slot: int) -> list[int]:
        return list(range(slot, self.n_streams, self.n_slots))

    # iteration
    def __iter__(self) -> TrainLoader:
        return self

    def __next__(self) -> Batch:
        if self._it is None:
            self._it = self._start()
        try:
            g, batch, update = next(self._it)
        except RuntimeError as e:
            if "timed out" not in str(e):
                raise
            self.close()
            raise DataError(
                f"data: no batch from this rank's DataLoader workers (rank {self.rank}) within "
                f"{self.cfg.worker_timeout_s:g} s (data.worker_timeout_s): a worker is stuck (a hung file "
                "system read?) or far too slow"
            ) from None
        if g == "error":
            self.close()
            raise DataError(batch)
        self.stream_states[update["stream"]] = update["state"]
        self.turns[g] = update["turn"]
        self.next_worker = (g - self.rank * self.workers + 1) % self.workers
        self.batches += 1
        return Batch.from_windows(batch, self.cfg, pin=self.pin_memory)

    def _start(self) -> Iterator:
        mine = self.slots()
        order = [mine[(w + self.next_worker) % self.workers] for w in range(self.workers)]  # worker 0 serves first
        ds = _Slots(self, order)
        if self.cfg.num_workers == 0:
            return iter(ds)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # workers tokenize single-threaded, without a warning
        return iter(
            torch.utils.data.DataLoader(
                ds,
                batch_size=None,
                num_workers=self.workers,
                prefetch_factor=4,
                worker_init_fn=workers.worker_init,
                collate_fn=workers.as_is,
                multiprocessing_context=workers.context(preload=(__name__,)),
                timeout=self.cfg.worker_timeout_s,
            )
        )

    def close(self) -> None:
        """Stop the worker processes (also done at garbage collection and at interpreter exit)."""
        it, self._it = self._it, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
            workers.stop(it._workers)

    # state
    def state_dict(self) -> dict:
        """This rank's view: its streams' global positions (JSON-serialisable, a few hundred bytes per stream)."""
        return {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint,
            # what the fingerprint hashes, so that a refusal can say what changed
            "source_fingerprints": {
                src.name: {"fingerprint": src.fingerprint, "files": list(src.files)} for src in self.sources
            },
            "tokenizer_fingerprint": self.tok.fingerprint,
            "seed": self.cfg.seed,
            "num_streams": self.n_streams,
            "world_size": self.world_size,
            "num_workers": self.workers,
            "rank": self.rank,
            "batches": self.batches,
            "next_worker": self.next_worker,
            "turns": {str(g): self.turns.get(g, 0) for g in self.slots()},
            "streams": {str(s): self.stream_states.get(s) for g in self.slots() for s in self.streams_of(g)},
            "consumed": self.consumed(),
        }

    def consumed(self) -> dict:
        """Per source, summed over this rank's streams: documents, empty documents, undecodable chars, bad records
        skipped (data.on_bad_record=skip), tokens."""
        out: dict = {s.name: {**dict.fromkeys(COUNTS, 0), "epoch": 0} for s in self.sources}
        for st in self.stream_states.values():
            for name, ps in (st or {}).get("sources", {}).items():
                for k in COUNTS:
                    out[name][k] += ps.get(k, 0)
                out[name]["tokens"] += ps["offset"]  # the partly used current document
                out[name]["epoch"] = max(out[name]["epoch"], ps["epoch"])
        return out

    def load_state_dict(self, states: list[dict]) -> None:
        """Restore from the states of ALL ranks of the saving run (index = saving rank)."""
        if not self.cfg.resume:
            say("data.resume=false: the saved data state is ignored; the stream starts afresh (data is repeated)")
            return
        if isinstance(states, dict):
            states = [states]
        check_states(states, self)
        first = states[0]
        merged = {int(s): st for state in states for s, st in state["streams"].items()}
        self.n_streams = first["num_streams"]
        self.stream_states = {s: merged[s] for g in self.slots() for s in self.streams_of(g)}
        if (first["world_size"], first["num_workers"]) == (self.world_size, self.workers):
            mine = states[self.rank]
            self.turns = {int(g): t for g, t in mine["turns"].items()}
            self.next_worker, self.batches = mine["next_worker"], mine["batches"]
        else:
            self.turns, self.next_worker, self.batches = {}, 0, 0
            say(
                f"{self.n_streams} streams saved by {first['world_size']} rank(s) x {first['num_workers']} worker(s) "
                f"resume on {self.world_size} x {self.workers}: every stream continues exactly; batches interleave "
                "differently"
            )
        self.close()


def _what_changed(saved: dict, loader: TrainLoader) -> str:
    """The sources (with their added and removed files) and the tokenizer whose fingerprints differ from a saved
    state's; states written before these were saved get the general phrase."""
    old = saved.get("source_fingerprints")
    if old is None:
        return "the sources or the tokenizer changed"
    said = []
    now = {src.name: src for src in loader.sources}
    for name in sorted(set(old) - set(now)):
        said.append(f"source {name!r} is gone")
    for name in sorted(set(now) - set(old)):
        said.append(f"source {name!r} is new")
    for name in sorted(set(old) & set(now)):
        src, before = now[name], old[name]
        if src.fingerprint == before["fingerprint"]:
            continue
        added = [f for f in src.files if f not in set(before["files"])]
        removed = [f for f in before["files"] if f not in set(src.files)]
        parts = [f"{w} {_some(fs)}" for w, fs in (("added", added), ("removed", removed)) if fs]
        said.append(
            f"source {name!r} changed ({'; '.join(parts)})"
            if parts
            else f"source {name!r} changed (same files, new contents or reading settings: {_some(src.files)})"
        )
    if saved.get("tokenizer_fingerprint") != loader.tok.fingerprint:
        said.append("the tokenizer changed")
    return ", ".join(said) or "the held-out split changed (data.val_fraction)"


def _some(files: list, n: int = 3) -> str:
    """The first n file names and how many more."""
    more = f" and {len(files) - n} more" if len(files) > n else ""
    return ", ".join(str(f) for f in files[:n]) + more


def check_states(states: list[dict], loader: TrainLoader) -> None:
    """One-line errors for every way a saved data state cannot be restored exactly."""
    cfg = loader.cfg
    if not states or any(not isinstance(s, dict) or s.get("version") != STATE_VERSION for s in states):
        raise DataError(f"data state: expected a list of version-{STATE_VERSION} loader states (one per saving rank)")
    first = states[0]
    if [s.get("rank") for s in states] != list(range(first["world_size"])):
        raise DataError(
            f"data state: got states of ranks {[s.get('rank') for s in states]}; pass the states of all "
            f"{first['world_size']} ranks of the saving run, in rank order"
        )
    if first["fingerprint"] != loader.fingerprint:
        if not cfg.ignore_fingerprint:
            raise DataError(
                f"data state: fingerprint {first['fingerprint']} != {loader.fingerprint}: "
                f"{_what_changed(first, loader)} since it was saved; set data.ignore_fingerprint=true to resume anyway"
            )
        say(
            f"fingerprint changed ({first['fingerprint']} -> {loader.fingerprint}); resuming anyway "
            "(data.ignore_fingerprint)"
        )
    if first["seed"] != cfg.seed:
        raise DataError(
            f"data.seed={cfg.seed} but the data state was saved with seed {first['seed']}; set "
            f"data.seed={first['seed']}"
        )
    n = first["num_streams"]
    if cfg.num_streams is not None and cfg.num_streams != n:
        raise DataError(
            f"data.num_streams={cfg.num_streams} but the data state has {n} streams; set data.num_streams={n} (or null)"
        )
    ids = sorted(int(s) for state in states for s in state["streams"])
    if ids != list(range(n)):
        raise DataError(
            f"data state: streams {sorted(set(range(n)) - set(ids)) or 'duplicated'} missing; pass the states of all "
            "ranks"
        )
    if n % loader.n_slots:
        fits = [d for d in range(1, n + 1) if n % d == 0]
        raise DataError(
            f"data state has {n} streams (saved by {first['world_size']} rank(s) x {first['num_workers']} worker(s)); "
            "this run's "
            f"world_size x data.num_workers = {loader.world_size} x {loader.workers} = {loader.n_slots} must divide "
            f"{n} "
            f"(one of {fits}); or set data.resume=false to restart the data stream (repeats data)"
        )


def build_train_loader(
    cfg: DataConfig, tok: Tokenizer, rank: int, world_size: int, micro_batch_size: int, pin_memory: bool = False
) -> TrainLoader:
    return TrainLoader(cfg, tok, rank, world_size, micro_batch_size, pin_memory)


def build_val_batches(
    cfg: DataConfig, tok: Tokenizer, batch_size: int, max_batches: int, max_tokens: Optional[int] = None
) -> list[Batch]:
    """Validation's batches (of batch_size windows of seq_len + 1 tokens): max_batches x batch_size windows spread
    over the whole held-out set (`held_out_windows`), each source's share proportional to its windows, evenly strided
    within it; the same windows every time (all of them where the set holds fewer)."""
    return spread_batches(held_out_windows(cfg, tok, max_tokens), cfg, batch_size, max_batches, "data.val")


def build_val_sets(
    cfg: DataConfig, tok: Tokenizer, batch_size: int, max_batches: int, max_tokens: Optional[int] = None
) -> dict[str, list[Batch]]:
    """Per held-out source (by name, config order): max_batches batches of its own windows, evenly strided over it, so
    that a loss can be reported per source. With data.val_fraction the sources are the training sources' held-out
    documents."""
    return per_source_batches(held_out_windows(cfg, tok, max_tokens), cfg, batch_size, max_batches)


def validation_sets(
    cfg: DataConfig, tok: Tokenizer, batch_size: int, max_batches: int, max_tokens: Optional[int], main: str
) -> dict[str, list[Batch]]:
    """The trainer's validation sets from one read of the held-out set: {main: build_val_batches'}, and with several
    held-out sources each one's own (build_val_sets')."""
    held = held_out_windows(cfg, tok, max_tokens)
    sets = {main: spread_batches(held, cfg, batch_size, max_batches, "data.val")}
    if len(held) > 1:
        sets.update(per_source_batches(held, cfg, batch_size, max_batches))
    return sets


def per_source_batches(
    held: dict[str, list[np.ndarray]], cfg: DataConfig, batch_size: int, max_batches: int
) -> dict[str, list[Batch]]:
    return {
        name: spread_batches({name: wins}, cfg, batch_size, max_batches, f"held-out source {name!r}")
        for name, wins in held.items()
    }


def held_out_windows(cfg: DataConfig, tok: Tokenizer, max_tokens: Optional[int] = None) -> dict[str, list[np.ndarray]]:
    """The held-out set: per held-out source (config order), its packed windows (`val_windows`) in file order, at most
    max_tokens // seq_len of them (trainer.val_tokens; None: every one)."""
    limit = None if max_tokens is None else max(1, max_tokens // cfg.seq_len)
    return {
        src.name: val_windows([src], cfg, tok, limit, f"held-out source {src.name!r}")
        for src in resolve_sources(cfg, val=True)
    }


def spread(sizes: list[int], count: int) -> list[list[int]]:
    """Which windows validation takes: `count` of them over sources holding `sizes` windows, each source's share
    proportional to its size (largest remainders; every source at least one while count allows), and within a source
    evenly strided, the middle of each of its share's equal slices. All of them where count >= sum(sizes)."""
    total = sum(sizes)
    if count >= total:
        return [list(range(n)) for n in sizes]
    exact = [count * n / total for n in sizes]
    floor = 1 if count >= sum(n > 0 for n in sizes) else 0  # every source that has windows gets one, if it can
    share = [min(n, max(int(e), floor)) for n, e in zip(sizes, exact)]
    while sum(share) > count:  # that minimum overshot: take back from the largest shares
        share[share.index(max(share))] -= 1
    by_remainder = sorted(range(len(sizes)), key=lambda i: int(exact[i]) - exact[i])  # largest remainder first
    while sum(share) < count:
        for i in by_remainder:
            if sum(share) < count and share[i] < sizes[i]:
                share[i] += 1
    return [[(2 * j + 1) * n // (2 * k) for j in range(k)] for n, k in zip(sizes, share)]


def spread_batches(
    windows: dict[str, list[np.ndarray]], cfg: DataConfig, batch_size: int, max_batches: int, what: str
) -> list[Batch]:
    """max_batches batches of batch_size windows `spread` over `windows` (source -> its windows), source by source;
    the last batch is short when the set holds fewer windows than asked for."""
    lists = list(windows.values())
    picked = [w[i] for w, idx in zip(lists, spread([len(w) for w in lists], batch_size * max_batches)) for i in idx]
    if len(picked) < batch_size:
        raise DataError(
            f"{what}: only {len(picked)} windows of {cfg.seq_len + 1} tokens, fewer than one batch of {batch_size}"
            + ("; raise data.val_fraction" if cfg.holds_out else "")
        )
    return [Batch.from_windows(np.stack(picked[i : i + batch_size]), cfg) for i in range(0, len(picked), batch_size)]


def val_windows(
    sources: list[Source], cfg: DataConfig, tok: Tokenizer, limit: Optional[int] = None, what: str = "data.val"
) -> list[np.ndarray]:
    """The held-out stream's packed windows ((3, seq_len + 1): tokens, document ids, loss marks), read once in file
    order with seed 0
    (the held-out stream must not change with the training seed): at most `limit`, or all of them. Validation's
    batches are spread over them (`spread`); `diffllm eval ppl` scores all of them (with data.val_fraction: the
    held-out documents only, as the trainer validates)."""
    stream = Stream(sources, tok, dataclasses.replace(cfg, seed=0), 0, 1, shuffle=False, epochs=1, part="val")
    windows: list[np.ndarray] = []
    while limit is None or len(windows) < limit:
        try:
            windows.append(stream.next_window())
        except StopIteration:
            break
        except DataError:
            if cfg.holds_out and not windows:  # the epoch check: no held-out document at all
                raise DataError(
                    f"data.val_fraction={cfg.val_fraction}: {what} has no held-out document; raise "
                    "data.val_fraction or configure data.val"
                ) from None
            raise
    return windows
