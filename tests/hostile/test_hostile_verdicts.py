"""Issue 26: a verdict never contradicts its own figures. Generated cases around each boundary: "at chance"
against the chance figures it prints, "equals" against the tolerances it prints, and a run summary's
"ONNX equals Gluon" against the comparison alone."""
from __future__ import annotations

import re

import numpy as np

from edgetrain.compare import compare_arrays
from edgetrain.figures import Chance


def _chance_cases():
    rng = np.random.RandomState(26)
    for _ in range(400):
        k = int(rng.randint(2, 12))
        n = int(rng.randint(3, 400))
        labels = rng.randint(0, k, n) if rng.rand() < 0.7 else np.repeat(rng.randint(0, k), n)
        ref = Chance.measure(0.0, labels, k)
        edge = ref.baseline + ref.margin
        for delta in (-0.1, -0.06, -0.05, -0.04, -0.01, 0.0, 0.01, 0.04, 0.049, 0.05, 0.051, 0.06, 0.1):
            yield labels, k, min(100.0, max(0.0, edge + delta + rng.uniform(-1e-6, 1e-6)))


def test_chance_verdict_agrees_with_the_figures_it_prints():
    checked = 0
    for labels, k, top1 in _chance_cases():
        c = Chance.measure(top1, labels, k)
        shown = lambda v: float(f"{v:.1f}")  # noqa: E731
        # the figures a reader sees: top-1, guessing, +/- margin; the verdict is read off them
        assert c.at_chance == (shown(c.top1) <= shown(c.baseline) + shown(c.margin) + 1e-9), (top1, c)
        assert abs(c.top1 - top1) <= 0.05 + 1e-9 and c.classes == len(np.unique(labels))
        msg = c.failures("ONNX model")
        assert bool(msg) == c.at_chance
        if msg:
            figures = [float(v) for v in re.findall(r"(\d+\.\d)", msg[0])]
            assert figures[0] == shown(c.top1)
            if c.classes > 1:  # "guessing gets B%, +/- M": the printed sum is at or above the printed score
                assert figures[1] == shown(c.baseline) and figures[2] == shown(c.margin)
                assert figures[0] <= figures[1] + figures[2] + 1e-9
            else:
                assert "all of one class" in msg[0]
        checked += 1
    assert checked > 4000


def _pairs():
    rng = np.random.RandomState(7)
    for _ in range(300):
        shape = (int(rng.randint(1, 4)), int(rng.randint(1, 30)))
        e = rng.randn(*shape) * 10.0 ** rng.uniform(-3, 2)
        noise = rng.randn(*shape) * 10.0 ** rng.uniform(-7, -2) * np.abs(e).max()
        yield e, e + noise, 10.0 ** rng.uniform(-6, -2), 10.0 ** rng.uniform(-5, -1)


def test_equals_verdict_agrees_with_the_tolerances_it_prints():
    failed = 0
    for e, a, atol, rtol in _pairs():
        r = compare_arrays("y", e, a, atol, rtol)
        line = r.summary()
        assert line.startswith("y: ok") == r.passed
        if r.passed:
            continue
        failed += 1
        m = re.search(r"would pass with atol (\S+) \(at rtol \S+\) or rtol (\S+) \(at atol", line)
        printed_atol, printed_rtol = float(m.group(1)), float(m.group(2))
        # each printed tolerance passes as printed, and it is not loose: 1% under it (3 digits) fails
        assert compare_arrays("y", e, a, printed_atol, rtol).passed, line
        assert compare_arrays("y", e, a, atol, printed_rtol).passed, line
        assert not compare_arrays("y", e, a, printed_atol * 0.98, rtol).passed, line
    assert failed > 30


def test_run_summary_says_onnx_equals_gluon_from_the_comparison_alone():
    from edgetrain.ops.run import RunResult, StepRun, summarize

    for compared in (True, False):
        for passed in (True, False):  # the export's overall verdict also holds chance and energy checks
            export = {"passed": passed and compared, "comparison": {"passed": compared}}
            result = RunResult(recipe="r", source="s", rundir="d", device="x",
                               steps=[StepRun("export", "done", 0, 1.0, [], "log", export)])
            assert summarize(result)["export_passed"] is compared
