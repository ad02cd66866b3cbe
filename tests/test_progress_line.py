"""The terminal's progress line (cli/render.py): what it says of a stage's ETA."""
from __future__ import annotations

import io
import re
import time

from edgetrain.cli.render import ProgressLine
from edgetrain.results import Progress


def test_no_eta_before_a_rate_is_measured_then_the_measured_one():
    """A fleet's progress said "ETA 0s" after round 1 of 10 (issue 37): the time before a stage's first event
    was never seen, so the first event has no ETA, and the next one's comes from the rate between the two."""
    stream = io.StringIO()  # not a terminal: the lines that stay
    line = ProgressLine(stream=stream)
    line(Progress("round", 1, 10, message="round 1: 2 update(s)", final=True))
    time.sleep(0.2)  # at least 0.2 s a round, 8 rounds left: at least 1.6 s
    line(Progress("round", 2, 10, message="round 2: 2 update(s)", final=True))
    first, second = stream.getvalue().splitlines()
    assert "1/10" in first and "ETA" not in first
    assert "2/10" in second and float(re.search(r"ETA (\d+)s", second).group(1)) >= 2


def test_a_stage_that_starts_from_zero_still_gets_its_eta_from_the_first_count():
    stream = io.StringIO()
    line = ProgressLine(stream=stream)
    line(Progress("calibrate", 0, 4, final=True))
    time.sleep(0.2)
    line(Progress("calibrate", 1, 4, final=True))
    assert float(re.search(r"ETA (\d+)s", stream.getvalue().splitlines()[1]).group(1)) >= 1


def test_an_epoch_line_names_its_epoch_without_a_bar():
    """Epoch events count epochs (done/total) for the API; the terminal's epoch line stays "epoch 2  loss ..."."""
    stream = io.StringIO()
    ProgressLine(stream=stream)(Progress("epoch", 2, 2, metrics={"epoch": 2, "loss": 0.5}, final=True))
    assert stream.getvalue() == "epoch 2  loss 0.5000\n"
