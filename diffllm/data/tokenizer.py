"""Tokenizers: load a tokenizer.json or HF tokenizer folder, train a byte-level BPE on the sources, cache it."""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import json
import os
import time
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Optional

from .config import DataConfig, DataError, TokenizerConfig, cache_dir
from .progress import say  # noqa: F401 - loader and packing say through here
from .sources import Reader, Source, resolve

BPE_VERSION = 1  # bump when train_bpe changes, so cached tokenizers are retrained


class Tokenizer:
    """A HF `tokenizers.Tokenizer` with the one special token the pipeline needs (EOS, appended per document)."""

    def __init__(self, tk, eos_token: str, origin: str):
        self.tk, self.eos_token, self.origin = tk, eos_token, origin
        tk.encode_special_tokens = True  # a literal "<|endoftext|>" inside a document is text, not a document end
        eos_id = tk.token_to_id(eos_token)
        if eos_id is None:
            raise DataError(f"{origin}: eos token {eos_token!r} is not in the vocabulary; set data.tokenizer.eos_token")
        self.eos_id: int = eos_id
        self.vocab_size: int = tk.get_vocab_size(with_added_tokens=True)
        self.fingerprint = hashlib.sha256(tk.to_str().encode()).hexdigest()[:16]

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tk.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=False)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        self.tk.save(str(tmp))
        os.replace(tmp, path)


def load_tokenizer(path: str, eos_token: str) -> Tokenizer:
    """From a tokenizer.json, or a HF tokenizer folder (its own eos_token wins over `eos_token`)."""
    p = Path(path).expanduser()
    if p.is_file():
        return Tokenizer(_read_json_tokenizer(p), eos_token, str(p))
    if not p.is_dir():
        raise DataError(f"data.tokenizer.path: {p}: no such file or folder")
    eos_token = _folder_eos(p) or eos_token
    if (p / "tokenizer.json").exists():
        return Tokenizer(_read_json_tokenizer(p / "tokenizer.json"), eos_token, str(p))
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure means "not a loadable tokenizer folder"
        raise DataError(
            f"data.tokenizer.path: {p}: no tokenizer.json and transformers cannot load it ({type(e).__name__})"
        ) from None
    if not getattr(hf, "is_fast", False):
        raise DataError(f"data.tokenizer.path: {p}: only fast (tokenizers-backed) tokenizers are supported")
    return Tokenizer(hf.backend_tokenizer, eos_token, str(p))


def _read_json_tokenizer(file: Path):
    """A tokenizers.Tokenizer from a tokenizer.json; a file it cannot read (not JSON, cut short, not a tokenizer) is
    a one-line DataError naming the file, not the library's traceback."""
    from tokenizers import Tokenizer as HFTokenizer

    try:
        return HFTokenizer.from_file(str(file))
    except Exception as e:  # noqa: BLE001 - the library raises a bare Exception ("EOF while parsing a string ...")
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DataError(f"{file}: not a readable tokenizer.json ({why})") from None


def _folder_eos(folder: Path) -> Optional[str]:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = folder / name
        if f.exists():
            try:
                eos = json.loads(f.read_text()).get("eos_token")
            except (ValueError, AttributeError) as e:  # not JSON, or not an object
                raise DataError(f"{f}: not a JSON object ({str(e).splitlines()[0][:200]})") from None
            if isinstance(eos, dict):
                eos = eos.get("content")
            if eos:
                return eos
    return None


def train_bpe(texts: Iterator[str], tcfg: TokenizerConfig):
    """A byte-level BPE (GPT-2 style: no unknown tokens, lossless decode) with EOS and any extra special tokens."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tk = HFTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    specials = [tcfg.eos_token] + [t for t in tcfg.special_tokens if t != tcfg.eos_token]
    trainer = trainers.BpeTrainer(
        vocab_size=tcfg.vocab_size,
        min_frequency=tcfg.min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(texts, trainer=trainer)
    return tk


def training_texts(sources: list[Source], max_chars: int, skip_bad: bool = False) -> Iterator[str]:
    """Documents of the sources in file order, round-robin across sources, up to max_chars characters (skip_bad:
    data.on_bad_record=skip)."""
    streams = [_source_texts(s, skip_bad) for s in sources]
    total = 0
    while streams and total < max_chars:
        for it in list(streams):
            text = next(it, None)
            if text is None:
                streams.remove(it)
            elif text:
                text = text[: max_chars - total]
                total += len(text)
                yield text


def _source_texts(src: Source, skip_bad: bool) -> Iterator[str]:
    reader = Reader(src, skip_bad=skip_bad)
    for f in range(src.n_files):
        for _, text, _ in reader.docs(f, 0, 1):
            if text:
                yield text


def default_path(cfg: DataConfig, sources: list[Source]) -> Path:
    t = cfg.tokenizer
    key = json.dumps(
        [
            BPE_VERSION,
            [s.fingerprint for s in sources],
            t.vocab_size,
            t.eos_token,
            t.special_tokens,
            t.min_frequency,
            t.train_chars,
        ]
    )
    return cache_dir() / "tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:16] / "tokenizer.json"


def train_sources(cfg: DataConfig) -> list[Source]:
    if not cfg.sources:
        raise DataError("data.sources: empty; configure at least one training source")
    sources = [resolve(s, f"data.sources[{i}]") for i, s in enumerate(cfg.sources)]
    wanted = cfg.tokenizer.train_on
    if not wanted:
        return sources
    names = [s.name for s in sources]
    for name in wanted:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (sources: {', '.join(names)})"
            raise DataError(f"data.tokenizer.train_on: no training source named {name!r}{hint}")
    return [s for s in sources if s.name in wanted]


def train_and_save(cfg: DataConfig, sources: list[Source], out: Path) -> tuple[Tokenizer, int, float]:
    """Train on the sources, write out; returns (tokenizer, training characters, seconds)."""
    t0 = time.perf_counter()
    chars = [0]

    def counted() -> Iterator[str]:
        for text in training_texts(sources, cfg.tokenizer.train_chars, cfg.on_bad_record == "skip"):
            chars[0] += len(text)
            yield text

    tk = train_bpe(counted(), cfg.tokenizer)
    tok = Tokenizer(tk, cfg.tokenizer.eos_token, str(out))
    tok.save(out)
    warn_vocab_size(tok, cfg.tokenizer, chars[0])
    return tok, chars[0], time.perf_counter() - t0


def warn_vocab_size(tok: Tokenizer, tcfg: TokenizerConfig, chars: int) -> None:
    """Say so, in one line, when the trained vocabulary is not the size asked (the model's embedding follows
    tok.vocab_size, so a run still works): below the byte-level minimum (256 bytes + the special tokens) it grows to
    that; BPE stops merging when no pair of tokens occurs min_frequency times any more, short of the size asked."""
    if tok.vocab_size > tcfg.vocab_size:
        say(
            f"warning: data.tokenizer.vocab_size={tcfg.vocab_size} is below the smallest byte-level BPE (256 byte "
            f"tokens + {tok.vocab_size - 256} special): the tokenizer has {tok.vocab_size} tokens; set "
            f"data.tokenizer.vocab_size={tok.vocab_size} or more to make it explicit"
        )
    if tok.vocab_size >= tcfg.vocab_size:
        return
    say(
        f"warning: the trained tokenizer has {tok.vocab_size} tokens, fewer than data.tokenizer.vocab_size="
        f"{tcfg.vocab_size}: its {chars:,} training characters hold no more pairs that occur at least "
        f"data.tokenizer.min_frequency={tcfg.min_frequency} times (the corpus is too small for that vocabulary). "
        f"Add text, lower min_frequency, or set data.tokenizer.vocab_size={tok.vocab_size} to make it explicit"
    )


def ensure_tokenizer(cfg: DataConfig) -> Tokenizer:
    """The configured tokenizer; the default (path null) is trained on the training sources once and cached."""
    if cfg.tokenizer.path:
        return load_tokenizer(cfg.tokenizer.path, cfg.tokenizer.eos_token)
    sources = train_sources(cfg)
    path = default_path(cfg, sources)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / ".lock", "w") as lock:  # concurrent ranks: one trains, the others wait and load
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                say(
                    f"no cached tokenizer for data={cfg.name}: training a byte-level BPE (vocab "
                    f"{cfg.tokenizer.vocab_size}) -> {path}"
                )
                try:
                    tok, chars, secs = train_and_save(cfg, sources, path)
                except BaseException:  # bad data, Ctrl-C: leave no cache folder that holds only its lock
                    _drop_if_only_lock(path.parent)
                    raise
                say(f"trained on {chars:,} characters in {secs:.1f} s: vocab {tok.vocab_size}")
    return load_tokenizer(str(path), cfg.tokenizer.eos_token)


def _drop_if_only_lock(folder: Path) -> None:
    """Remove a cache folder whose training failed, when nothing but its `.lock` is in it."""
    try:
        if [p.name for p in folder.iterdir()] == [".lock"]:
            (folder / ".lock").unlink()
            folder.rmdir()
    except OSError:  # another process got there first, or wrote into it: leave it
        pass


def encode_throughput(tok: Tokenizer, texts: list[str], batch_docs: int = 64) -> tuple[int, float]:
    """(tokens, seconds) for encode_batch over texts in batches."""
    t0, n = time.perf_counter(), 0
    it = iter(texts)
    while batch := list(islice(it, batch_docs)):
        n += sum(len(ids) for ids in tok.encode_batch(batch))
    return n, time.perf_counter() - t0
