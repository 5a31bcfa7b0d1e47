"""diffllm/launch/relay.py on torchrun's own stderr, as torchrun 2.13 wrote it (recorded from `diffllm launch --procs 2`
resuming a 1-rank ZeRO-0 run, and from bare torchrun stopped by SIGTERM): the ranks' lines pass as they come, a line
every rank says alike once, torchrun's closing traceback is read for the ranks' exit codes and not shown; any other
traceback is. tests/launch/test_launch_lifeline.py runs the real thing."""

from __future__ import annotations

import io
from pathlib import Path

from diffllm.launch.relay import Relay, Report

TORCHRUN = "/venv/bin/torchrun"
REFUSAL = (
    "diffllm train: error: trainer.zero_stage: /runs/a/checkpoints/step4 was saved with ZeRO-0 on 2 rank(s), which "
    "cannot be resharded; resume it with trainer.zero_stage=0 on 2 rank(s)\n"
)
TRANSCRIPTS = Path(__file__).parent / "transcripts"
# torchrun's closing frames (the first is its own executable), and its whole stderr after the ranks failed
# ({code0} and {code1}: their exit codes) or after SIGTERM (the rank's own line among torchrun's)
FRAMES = (TRANSCRIPTS / "frames.txt").read_text()
FAILED = (TRANSCRIPTS / "child-failed.txt").read_text()
SIGNALLED = (TRANSCRIPTS / "signal.txt").read_text()


def relay(text: str) -> tuple[str, Report]:
    out = io.StringIO()
    r = Relay(11809, TORCHRUN, out)
    for line in text.splitlines(keepends=True):
        r.feed(line)
    report = r.close()  # what it held back and does not understand is shown at the end
    return out.getvalue(), report


def test_a_refusal_every_rank_says_is_shown_once_with_the_ranks_exit_code():
    shown, report = relay(REFUSAL * 4 + FAILED.format(code0=2, code1=2))
    assert shown == REFUSAL
    assert (report.codes, report.root, report.exit_code()) == ({1: 2, 0: 2}, 0, 2)


def test_refusals_glued_together_by_ranks_writing_at_once_are_shown_once():
    """Seen with 4 ranks: two ranks' lines, each written as text then newline, arrived as `AB\\n\\n`."""
    glued = REFUSAL.rstrip("\n") + REFUSAL + "\n" + "a warning" + REFUSAL + "\n" + "[diffllm.train] a line\n"
    shown, report = relay(glued + FAILED.format(code0=2, code1=2))
    assert shown == REFUSAL + "a warning\n[diffllm.train] a line\n" and report.exit_code() == 2


def test_torchruns_signal_exception_is_not_shown():
    shown, report = relay(SIGNALLED)
    assert shown == "[diffllm.train] SIGTERM received: finishing this step, saving a checkpoint, then exiting\n"
    assert report.signal and report.exit_code() is None


def test_the_exit_code_is_the_rank_that_says_why():
    """A rank whose collective failed because another ended (6) is no cause: the other rank's code is given; a rank
    killed by a signal is 128 + its number."""
    assert relay(FAILED.format(code0=6, code1=5))[1].exit_code() == 5
    report = relay(FAILED.format(code0=-9, code1=6))[1]
    assert report.exit_code() == 137
    assert report.describe() == "rank 0 exited with signal SIGKILL, rank 1 with code 6"


def test_other_tracebacks_are_shown_as_they_are():
    rank = (
        'Traceback (most recent call last):\n  File "<frozen runpy>", line 198, in _run_module_as_main\nKeyError: 1\n'
    )
    shown, report = relay(rank + REFUSAL)
    assert shown == rank + REFUSAL and report.exit_code() is None
    timeout = FRAMES + "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: \n"
    shown, report = relay(timeout)
    assert shown == timeout and report.exit_code() is None
    other_pid = FAILED.format(code0=2, code1=2).replace(" 11809 ", " 999 ").split("Traceback")[0]
    assert relay(other_pid)[0] == other_pid  # a rank's own torch warnings are the rank's: shown
