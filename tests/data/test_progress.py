"""Progress of long data passes: a tqdm bar on a terminal; in a log (stderr redirected) plain lines, one per tenth of
the work and one at the end, never a carriage return."""

from __future__ import annotations

import io
import os

from tqdm import tqdm

from diffllm.data.progress import Lines, progress


def test_a_log_gets_plain_lines_at_each_tenth_and_at_the_end():
    log = io.StringIO()
    with progress(1000, "ppl plays", stream=log) as bar:
        assert isinstance(bar, Lines)
        for _ in range(40):
            bar.update(25)  # 40 updates: 9 lines on the way (10% ... 90%), then the total
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 10
    assert lines[0] == "ppl plays: 100/1,000 tok (10%)" and lines[8] == "ppl plays: 900/1,000 tok (90%)"
    assert lines[9].startswith("ppl plays: 1,000 tok in ") and lines[9].endswith(" s")


def test_a_big_step_says_one_line_and_an_empty_total_only_the_end():
    log = io.StringIO()
    with progress(100, "x", stream=log) as bar:
        bar.update(55)
    assert log.getvalue().splitlines()[0] == "x: 55/100 tok (55%)" and len(log.getvalue().splitlines()) == 2
    log = io.StringIO()
    with progress(0, "y", stream=log) as bar:
        bar.update(3)
    assert log.getvalue().startswith("y: 3 tok in ") and len(log.getvalue().splitlines()) == 1


def test_a_terminal_gets_the_bar():
    main, other = os.openpty()
    with os.fdopen(other, "w") as tty:
        with progress(10, "z", stream=tty) as bar:
            assert isinstance(bar, tqdm)
            bar.update(10)
    os.close(main)
