"""Profile reports: self-contained HTML (inline SVG) and Markdown rendered from the same numbers as --json."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from edgetrain.errors import UsageError
from edgetrain.api import profile
from edgetrain.measure.report import against_plan, check_report_path, render_html, render_markdown, text_summary, write_report
from test_profile_models import conv_gemm_onnx


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    path = conv_gemm_onnx(tmp_path_factory.mktemp("report") / "m.onnx")
    res = profile(str(path), threads="1,2", device="x86-64-generic", rate="360/h", battery_wh=50, budget_mj=1000,
                  input_shape=(3, 16, 16), warmup=1, runs=12)
    # Through JSON, as the CLI does: the report must render from exactly what --json carries.
    return json.loads(json.dumps(res.to_dict()))


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.refs = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href") or (k == "xlink:href"):
                self.refs.append(v)


def test_html_is_self_contained_with_every_section(result):
    page = render_html(result)
    parser = _Collect()
    parser.feed(page)
    assert parser.refs == []  # no external scripts, styles, images or links
    assert "<link" not in page and "<script" not in page
    assert parser.tags.count("svg") >= 4  # histogram, thread sweep, memory, energy over a day
    for heading in ("Latency", "Thread sweep", "Memory", "Energy", "Where the time goes", "Provenance of every figure"):
        assert f"<h2>{heading}" in page, heading
    for prov in ("measured", "estimated", "modelled"):
        assert f">{prov}</span>" in page
    assert "Conv" in page and "pass" in page


def test_html_shows_the_json_numbers(result):
    page = render_html(result)
    from edgetrain.svgchart import fmt as _fmt

    assert _fmt(result["best"]["p50_ms"]) in page
    assert _fmt(result["energy"]["daily"]["energy_wh_per_day"]) in page
    for f in result["figures"]:
        assert _fmt(f["value"]) in page


def test_markdown_has_tables_and_provenance(result):
    md = render_markdown(result)
    assert md.startswith("# edgetrain profile:")
    assert re.search(r"^\| threads \| p50 ms", md, re.MULTILINE)
    assert "## Provenance of every figure" in md and "| modelled |" in md
    assert "```" in md  # the text histogram


def test_text_summary_labels_device_figures(result):
    lines = text_summary(result)
    assert any(line.startswith("latency") and "[estimated:" in line for line in lines)
    assert any(line.startswith("budget") and "PASS" in line for line in lines)


def test_the_memory_plan_is_compared_as_measured_against_predicted(result):
    """"predicted 63.7 MB, measured 66.7 MB (-4.5%)" read backwards (issue 37): the words say where the measured
    peak lies relative to the plan, in the text, the HTML and the Markdown alike."""
    assert against_plan({"peak_rss_mb": 63.7, "measured_peak_rss_mb": 66.7}) == "4.7% above the plan"
    assert against_plan({"peak_rss_mb": 66.7, "measured_peak_rss_mb": 63.7}) == "4.5% below the plan"
    assert against_plan({"peak_rss_mb": 60.0, "measured_peak_rss_mb": 60.01}) == "as planned"
    p = result["prediction"]
    phrase = against_plan(p)
    rel = 100 * (p["measured_peak_rss_mb"] - p["peak_rss_mb"]) / p["peak_rss_mb"]
    assert phrase.endswith("above the plan" if rel > 0.05 else "below the plan" if rel < -0.05 else "as planned")
    line = next(line for line in text_summary(result) if line.startswith("memory"))
    assert line.endswith(f"({phrase})") and "%)" not in line.replace(phrase, "")
    assert f"(measured {phrase})" in render_html(result) and f"(measured {phrase})" in render_markdown(result)


def test_an_op_breakdown_measured_on_a_busy_host_says_so_beside_it(result):
    """"Flatten 89%" came from a loaded host without a word (issue 37): the load around the op profile is kept
    with it, and above the usable cores the breakdown is flagged in the text, the HTML and the Markdown."""
    import copy

    from edgetrain.host import oversubscribed
    from edgetrain.measure.profiling import flag_busy_ops

    cores = result["host"]["cores_usable"]
    for config in result["configs"]:  # as measured here: the flag is the one busy-host test on the kept load
        ops = config["ops"]
        assert ops["available"] and ops["busy_host"] == oversubscribed(ops["loadavg"], cores)
    for load, busy in ((cores + 3.0, True), (0.1, False)):
        d = copy.deepcopy(result)
        best = next(c for c in d["configs"] if c["threads"] == d["best"]["threads"])
        best["ops"]["loadavg"] = load
        best["ops"].pop("busy_note", None)
        flag_busy_ops(best["ops"], cores)
        line = next(line for line in text_summary(d) if line.startswith("ops"))
        assert ("[busy host: load" in line and f"over {cores} cores, shares doubtful]" in line) == busy, line
        note = "measured on a busy host (1-minute load"
        assert (note in render_html(d)) == busy and (note in render_markdown(d)) == busy


def test_write_report_is_atomic_and_picks_the_format(result, tmp_path):
    write_report(tmp_path / "r.md", result)
    write_report(tmp_path / "r.html", result)
    assert (tmp_path / "r.md").read_text().startswith("# edgetrain profile")
    assert (tmp_path / "r.html").read_text().startswith("<!doctype html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.md"]  # no temp files left


@pytest.mark.parametrize("name,fragment", [("missing/r.html", "folder does not exist"), ("r.pdf", "unknown report format"),
                                           ("r", "unknown report format")])
def test_bad_report_paths(tmp_path, name, fragment):
    with pytest.raises(UsageError, match=fragment):
        check_report_path(tmp_path / name)
