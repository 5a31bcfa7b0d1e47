"""What `diffllm launch` passes on of its launcher's stderr (the ranks write to the same pipe): everything, as it comes,
but torchrun's own report of the ranks' failure, which the launcher reads instead, and repeats.

- A line every rank writes alike (a `diffllm train: error:` refusal, said by each of 4 ranks) is shown once, also when
  two ranks' lines arrive glued together.
- torchrun's closing traceback (the one whose first frame is the launcher's own executable) ending in ChildFailedError
  (~40 lines) or SignalException (~28 lines, after SIGTERM) is held back: the first names each failed rank's exit code,
  which `Report.exit_code` gives back (torchrun itself exits 1 whatever the ranks said). Any other traceback of the
  launcher (a rendezvous timeout, a bad option) is shown as it is.
- torchrun's log lines about the ranks' end ("failed (exitcode: 2) local_rank: 0 ...", "Sending process N closing
  signal SIGTERM") are left out: they say again what the ranks' own lines and that exit code say."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Optional, TextIO

TRACEBACK = "Traceback (most recent call last):"
RANK_ERROR = "diffllm train: error:"
# torchrun's log lines (glog style: level, date, time, pid, source) about the ranks' end
_ELASTIC_LOG = re.compile(r"^[IWEF]\d{4} [\d:.]+ +(\d+) \S*torch/distributed/\S+\] ")
_ABOUT_THE_END = ("failed (exitcode", "closing signal", "death signal", "Sending process")
_RAISED = re.compile(r"^torch\.distributed\.elastic\.\S*\b(ChildFailedError|SignalException)\b")
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
EXIT_PEER_LOST = 6  # diffllm/train/app.py: a rank whose collective failed because another rank ended first


@dataclass
class Report:
    """torchrun's report of the failed ranks: {rank: exit code} and the first one to fail (its root cause)."""

    codes: dict[int, int] = field(default_factory=dict)
    root: Optional[int] = None
    signal: bool = False  # torchrun itself was stopped by a signal (SignalException)

    def exit_code(self) -> Optional[int]:
        """The ranks' exit code: the first failure's, unless it only lost its peer (6) where another rank says why;
        a rank killed by signal N is 128 + N, as a shell says it. None without a report."""
        if not self.codes:
            return None
        order = ([self.root] if self.root in self.codes else []) + sorted(self.codes)
        chosen = next((r for r in order if self.codes[r] != EXIT_PEER_LOST), order[0])
        code = self.codes[chosen]
        return 128 - code if code < 0 else code

    def describe(self) -> str:
        """`rank 0 exited with code 5, rank 1 with 6`."""
        parts = []
        for i, (r, c) in enumerate(sorted(self.codes.items(), key=lambda rc: rc[0] != self.root)):
            how = f"signal {signal.Signals(-c).name}" if c < 0 and -c in signal.valid_signals() else f"code {c}"
            parts.append(f"rank {r} exited with {how}" if i == 0 else f"rank {r} with {how}")
        return ", ".join(parts)


class Relay:
    """`feed(line)` each line of the launcher's stderr; `close()` at its end -> the Report of what it held back."""

    def __init__(self, launcher_pid: int, executable: str, out: TextIO):
        self.pid, self.executable, self.out = str(launcher_pid), executable, out
        self.said: set[str] = set()
        self.owed = 0  # blank lines still to come that belong to rank error lines glued together
        self.held: Optional[list[str]] = None  # the launcher's own traceback, from its first line
        self.pending: Optional[str] = None  # a Traceback line: whose it is shows in the next line

    def _emit(self, line: str) -> None:
        self.out.write(line)
        self.out.flush()

    def feed(self, line: str) -> None:
        if self.held is not None:
            self.held.append(line)
            return
        if self.pending is not None:
            first, self.pending = self.pending, None
            if line.lstrip().startswith(f'File "{self.executable}"'):
                self.held = [first, line]
                return
            self._emit(first)
        if line.rstrip("\n") == TRACEBACK:
            self.pending = line
            return
        log = _ELASTIC_LOG.match(line)
        if log and log.group(1) == self.pid and any(s in line for s in _ABOUT_THE_END):
            return
        if RANK_ERROR in line:
            self._rank_errors(line)
            return
        if self.owed and not line.strip():
            self.owed -= 1  # the newline of an error line that arrived glued to another one
            return
        self._emit(line)

    def _rank_errors(self, line: str) -> None:
        """Each rank's refusal once. Ranks that print at the same moment can glue their lines together (print writes
        the text and its newline apart): `A...B...\n` then `\n`; they are cut apart, and the stray newline owed."""
        head, *rest = line.split(RANK_ERROR)
        pieces = ([head] if head else []) + [RANK_ERROR + p for p in rest]
        pieces = [p if p.endswith("\n") else p + "\n" for p in pieces]
        self.owed += len(pieces) - 1
        for piece in pieces:
            if not piece.startswith(RANK_ERROR):
                self._emit(piece)  # another line's text, cut off from its newline
            elif piece not in self.said:
                self.said.add(piece)
                self._emit(piece)

    def close(self) -> Report:
        """The report parsed from the launcher's held traceback (shown after all when it is another error)."""
        if self.pending is not None:
            self._emit(self.pending)
        held, self.held, self.pending = self.held or [], None, None
        raised = next((m.group(1) for line in held if (m := _RAISED.match(line))), None)
        report, rank, root_section = Report(signal=raised == "SignalException"), None, False
        for line in held if raised == "ChildFailedError" else []:
            root_section = root_section or line.startswith("Root Cause")
            if m := _RANK.match(line):
                rank = int(m.group(1))
            elif (m := _EXITCODE.match(line)) and rank is not None:
                report.codes[rank] = int(m.group(1))
                if root_section and report.root is None:
                    report.root = rank
        if not (report.codes or report.signal):  # another error of the launcher's, or a report not understood
            for line in held:
                self._emit(line)
        return report
