"""`diffllm tokenizer train` and `diffllm data prepare`: the data commands (Hydra apps on configs/tokenizer.yaml and
configs/data_prepare.yaml; any data group and data.* override applies)."""
from __future__ import annotations

from itertools import islice
from pathlib import Path

from omegaconf import DictConfig

from ..config import hydra_app
from ..config import build
from .config import DataConfig
from .loader import resolve_sources
from .prepare import prepare_source
from .sources import SYNTHETIC
from .tokenizer import default_path, encode_throughput, ensure_tokenizer, train_and_save, train_sources, training_texts
from ..errors import UserError


@hydra_app("tokenizer", prog="diffllm tokenizer train")
def train_main(cfg: DictConfig) -> None:
    """Train the byte-level BPE on data.sources, write tokenizer.json, report encode throughput."""
    data = build(DataConfig, cfg.data, "data")  # a bad value or a DataError: one line, exit 2 (hydra_app)
    sources = train_sources(data)
    out = Path(cfg.out) if cfg.out else default_path(data, sources)
    tok, chars, secs = train_and_save(data, sources, out)
    sample_sources = resolve_sources(data, val=True) if data.val else sources
    texts = list(islice(training_texts(sample_sources, int(cfg.bench_chars)), 100_000))
    n, t = encode_throughput(tok, texts)
    sample_chars = sum(map(len, texts))
    print(f"tokenizer            {out}")
    print(f"vocab                {tok.vocab_size} (eos {tok.eos_token!r} = {tok.eos_id})")
    print(f"trained on           {chars:,} characters of data={data.name} in {secs:.1f} s")
    print(f"encode throughput    {n / t:,.0f} tokens/s ({sample_chars / t / 1e6:.2f} M chars/s) on {sample_chars:,} characters, "
          f"{sample_chars / max(n, 1):.2f} chars/token")
    if cfg.out:
        print(f"use it with          data.tokenizer.path={out}")


@hydra_app("data_prepare", prog="diffllm data prepare")
def prepare_main(cfg: DictConfig) -> None:
    """Pre-tokenize every training (and held-out) source into out/<source>/ for data.prepared_dir=out."""
    data = build(DataConfig, cfg.data, "data")
    if data.prepared_dir:
        raise UserError("data.prepared_dir is set; prepare reads the raw sources (unset it)")
    tok = ensure_tokenizer(data)
    sources = resolve_sources(data) + (resolve_sources(data, val=True) if cfg.val and data.val else [])
    out = Path(cfg.out)
    print("| source | files | docs | empty | undecodable | tokens | seconds | tokens/s |")
    print("|---|---|---|---|---|---|---|---|")
    for src in sources:
        if src.kind in SYNTHETIC:
            print(f"| {src.name} | synthetic: generated on the fly, also with data.prepared_dir (nothing to prepare) |||||||")
            continue
        m = prepare_source(src, tok, out, int(cfg.workers))
        print(f"| {src.name} | {src.n_files} | {m['docs']:,} | {m['empty']:,} | {m['undecodable']:,} | {m['tokens']:,} | "
              f"{m['seconds']:.2f} | {m['tokens'] / max(m['seconds'], 1e-9):,.0f} |")
    print(f"train from it with   data.prepared_dir={out}")
