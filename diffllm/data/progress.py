"""Progress of a long pass over data (scoring a held-out set, preparing shards): a tqdm bar when stderr is a terminal;
otherwise (a log file, a pipe) plain lines, one per tenth of the work and one at the end, instead of a bar redrawn
with carriage returns (10 KB of `\\r` updates per `eval ppl` in a redirected log). HF datasets' and the Hub's own
bars are switched off there too (`quiet_library_bars`)."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

STEPS = 10  # plain lines: one each time another tenth of the total is done


def say(msg: str) -> None:
    """One line of the data layer to the user, on stderr."""
    print(f"[diffllm.data] {msg}", file=sys.stderr, flush=True)


def progress(total: int, desc: str, unit: str = "tok", stream: Optional[TextIO] = None):
    """A context manager with update(n) and close(): tqdm on a terminal, else `Lines`."""
    stream = stream or sys.stderr
    if _is_terminal(stream):
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False, file=stream)
    return Lines(total, desc, unit, stream)


class Lines:
    """`desc: 1,234/12,340 tok (10%)` at each tenth, then `desc: 12,340 tok in 3.1 s`."""

    def __init__(self, total: int, desc: str, unit: str, stream: TextIO):
        self.total, self.desc, self.unit, self.stream = max(0, int(total)), desc, unit, stream
        self.n, self._said, self._t0, self._closed = 0, 0, time.perf_counter(), False

    def update(self, n: int = 1) -> None:
        self.n += n
        tenth = min(STEPS, self.n * STEPS // self.total) if self.total else 0
        if tenth > self._said and self.n < self.total:
            self._said = tenth
            self._line(f"{self.n:,}/{self.total:,} {self.unit} ({100 * self.n // self.total}%)")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._line(f"{self.n:,} {self.unit} in {time.perf_counter() - self._t0:.1f} s")

    def _line(self, text: str) -> None:
        self.stream.write(f"{self.desc}: {text}\n")
        self.stream.flush()

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def quiet_library_bars(stream: Optional[TextIO] = None) -> None:
    """When stderr is no terminal: no progress bars from HF datasets (e.g. "Resolving data files") or the Hub."""
    if _is_terminal(stream or sys.stderr):
        return
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
