"""`diffllm tokenizer train` and `diffllm data prepare`: the data commands (Hydra apps on configs/tokenizer.yaml and
configs/data_prepare.yaml; any data group and data.* override applies). Their own keys are typed by
TokenizerTrainConfig and PrepareConfig (named in their registry entries, diffllm/cli/registry.py); this module imports
the data pipeline only when a command runs, so composing their configs and --help stay light."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from ..config import hydra_app
from ..errors import UserError
from .config import DataConfig


@dataclass
class TokenizerTrainConfig:
    out: Optional[str] = None  # null -> the cache path that training uses by default for this data config
    bench_chars: int = 4_000_000  # characters of held-out (else training) text for the encode throughput report


@dataclass
class PrepareConfig:
    out: str = "prepared/data"  # the folder of shards (configs/data_prepare.yaml: prepared/<data.name>)
    workers: int = 1  # processes tokenizing files in parallel
    val: bool = True  # also prepare the held-out sources

    def validate(self) -> None:
        if self.workers < 1:
            raise UserError(f"workers={self.workers}: must be at least 1")


TOKENIZER = {"data": DataConfig, "": TokenizerTrainConfig}  # the typed configs of configs/tokenizer.yaml
PREPARE = {"data": DataConfig, "": PrepareConfig}  # ... and of configs/data_prepare.yaml


@hydra_app("tokenizer", TOKENIZER, prog="diffllm tokenizer train")
def train_main(cfg: DictConfig, typed: dict) -> None:
    """Train the byte-level BPE on data.sources, write tokenizer.json, report encode throughput."""
    from .loader import resolve_sources
    from .tokenizer import default_path, encode_throughput, train_and_save, train_sources, training_texts

    data, c = typed["data"], typed[""]
    sources = train_sources(data)
    out = Path(c.out) if c.out else default_path(data, sources)
    tok, chars, secs = train_and_save(data, sources, out)
    sample_sources = resolve_sources(data, val=True) if data.val else sources
    texts = list(islice(training_texts(sample_sources, c.bench_chars), 100_000))
    n, t = encode_throughput(tok, texts)
    sample_chars = sum(map(len, texts))
    print(f"tokenizer            {out}")
    print(f"vocab                {tok.vocab_size} (eos {tok.eos_token!r} = {tok.eos_id})")
    print(f"trained on           {chars:,} characters of data={data.name} in {secs:.1f} s")
    print(
        f"encode throughput    {n / t:,.0f} tokens/s ({sample_chars / t / 1e6:.2f} M chars/s) on {sample_chars:,} "
        "characters, "
        f"{sample_chars / max(n, 1):.2f} chars/token"
    )
    if c.out:
        print(f"use it with          data.tokenizer.path={out}")


@hydra_app("data_prepare", PREPARE, prog="diffllm data prepare")
def prepare_main(cfg: DictConfig, typed: dict) -> None:
    """Pre-tokenize every training (and held-out) source into out/<source>/ for data.prepared_dir=out."""
    from .loader import resolve_sources
    from .prepare import prepare_source
    from .sources import SYNTHETIC
    from .tokenizer import ensure_tokenizer

    data, c = typed["data"], typed[""]
    if data.prepared_dir:
        raise UserError("data.prepared_dir is set; prepare reads the raw sources (unset it)")
    tok = ensure_tokenizer(data)
    sources = resolve_sources(data) + (resolve_sources(data, val=True) if c.val and data.val else [])
    out = Path(c.out)
    print("| source | files | docs | empty | undecodable | tokens | seconds | tokens/s |")
    print("|---|---|---|---|---|---|---|---|")
    for src in sources:
        if src.kind in SYNTHETIC:
            print(
                f"| {src.name} | synthetic: generated on the fly, also with data.prepared_dir (nothing to prepare) "
                "|||||||"
            )
            continue
        m = prepare_source(src, tok, out, c.workers, skip_bad=data.on_bad_record == "skip")
        print(
            f"| {src.name} | {src.n_files} | {m['docs']:,} | {m['empty']:,} | {m['undecodable']:,} | {m['tokens']:,} | "
            f"{m['seconds']:.2f} | {m['tokens'] / max(m['seconds'], 1e-9):,.0f} |"
        )
    print(f"train from it with   data.prepared_dir={out}")
