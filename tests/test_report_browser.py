"""The HTML reports in a real browser (issue 24, item 7): headless Chromium lays the profile report and the run
report out at a phone's width (390 px) and a desktop's (1280 px), takes a screenshot of each, and a probe in the
page reports chart labels its SVG cuts off, charts reaching past the screen's edge and elements that do
(tests/browser.py). Chromium is Debian's ``chromium`` package; CI installs it (.ci/run, native stage)."""
from __future__ import annotations

import json
import pytest

import browser
from edgetrain.api import profile
from edgetrain.measure.report import render_html
from edgetrain.ops.run import RunResult, StepRun
from edgetrain.run_report import write_run_report
from test_profile_models import conv_gemm_onnx

pytestmark = pytest.mark.skipif(
    browser.chromium() is None,
    reason="LOUD SKIP: no chromium on PATH, the reports were NOT checked in a browser (apt-get install chromium)")


@pytest.fixture(scope="module")
def profile_page(tmp_path_factory):
    d = tmp_path_factory.mktemp("browser")
    model = conv_gemm_onnx(d / "m.onnx")
    res = profile(str(model), threads="1,2", device="rpi4b-4gb", rate="360/h", battery_wh=50, budget_mj=1000,
                  input_shape=(3, 16, 16), warmup=1, runs=12, country="DE")
    page = d / "profile.html"
    page.write_text(render_html(json.loads(json.dumps(res.to_dict()))), encoding="utf-8")
    return page


@pytest.fixture(scope="module")
def run_page(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    (d / "logs").mkdir()
    log = d / "logs" / "export.log"
    log.write_text("exporting\nTraceback (most recent call last):\nMemoryError: std::bad_alloc\n", encoding="utf-8")
    res = RunResult("quickstart", "bundled quickstart", str(d), "rpi4b-4gb", exit_code=3, failed_step="quantize")
    res.steps = [
        StepRun("finetune", "done", 0, 12.0, ["finetune"], str(d / "logs" / "finetune.log"),
                {"energy": {"joules": 360.0, "provenance": "modelled"}}),
        StepRun("quantize", "budget not met", 3, 30.0, ["quantize"], str(d / "logs" / "quantize.log"),
                {"failed_checks": ["int8 top-1 dropped 2.41 points, more than --max-drop 1.0"]}),
        StepRun("export", "failed", 1, 3.0, ["export"], str(log)),
    ]
    res.summary = {"energy_per_inference_mj": 1.583, "energy_per_inference_uncertainty_mj": 0.61,
                   "energy_provenance": "modelled", "carbon_per_inference_g": 1.5e-4, "carbon_g_per_kwh": 342.06,
                   "latency_p50_ms": 0.437, "latency_provenance": "estimated"}
    page = d / "report.html"
    write_run_report(res, page)
    return page


@pytest.mark.parametrize("width", browser.WIDTHS.values(), ids=browser.WIDTHS.keys())
@pytest.mark.parametrize("which", ["profile", "run"])
def test_the_reports_read_whole_at_phone_and_desktop_widths(which, width, profile_page, run_page, tmp_path):
    page = profile_page if which == "profile" else run_page
    browser.assert_reads_whole(page, width, tmp_path / f"{which}-{width}.png")


def test_the_p99_label_of_the_histogram_is_whole(profile_page):
    """It read "p9" (the SVG cut it at its right edge): the label is there, inside the chart, at both widths."""
    html = profile_page.read_text(encoding="utf-8")
    assert ">p99 " in html
    for width in browser.WIDTHS.values():
        assert not any(c["text"].startswith("p99") for c in browser.layout(profile_page, width)["clipped_text"])


def test_the_profile_report_gives_the_energy_its_uncertainty_and_its_grams(profile_page):
    text = profile_page.read_text(encoding="utf-8")
    assert " mJ +" in text and "(modelled, p10-p90 latency x the profile&#x27;s power range)" in text
    assert "Germany 2024 grid, 342.06 g/kWh [table]" in text and "Ember yearly electricity data" in text


def test_the_run_report_says_why_each_step_failed(run_page):
    text = run_page.read_text(encoding="utf-8")
    assert "did not pass (exit code 3): int8 top-1 dropped 2.41 points" in text
    assert "its log ends: MemoryError: std::bad_alloc" in text  # a crash without an Error: line: its log's last line
    assert "1.583 mJ ± 0.61 mJ [modelled]" in text and "150 µg at 342.06 g/kWh" in text
