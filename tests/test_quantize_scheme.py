"""The int8 scheme chosen per device, and the calibration reader's sampling and striding."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain.devices import load_device
from edgetrain.int8.scheme import choose_scheme, scheme_for


def test_x86_without_vnni_reduces_range_and_warns():
    s = scheme_for(load_device("x86-64-generic"))
    assert (s.format, s.activations, s.weights, s.reduce_range) == ("QDQ", "uint8", "int8", True)
    assert "saturat" in s.reason and "VNNI" in s.warning
    assert s.to_dict()["name"] == "QDQ U8S8 (per-channel, reduce_range)"


def test_x86_with_vnni_uses_the_full_range_without_warning():
    s = choose_scheme("x86_64", {"avx2": True, "vnni": True}, "gateway", per_channel=False)
    assert not s.reduce_range and s.warning is None and s.name == "QDQ U8S8 (per-tensor)"


@pytest.mark.parametrize("name,warns", [("rpi5-8gb", False), ("rpi4b-4gb", True), ("rpi3bplus", True),
                                        ("rpi-zero2w", True), ("jetson-nano-5w", True)])
def test_arm_boards_get_s8s8_and_a_warning_without_dot_product(name, warns):
    profile = load_device(name)
    s = scheme_for(profile)
    assert (s.activations, s.weights, s.reduce_range) == ("int8", "int8", False)
    assert (s.warning is not None) == warns == (not profile.isa.dotprod)
    assert s.target.startswith(name)


def test_without_a_device_the_host_decides():
    from edgetrain.host import detect_host

    host = detect_host()
    s = scheme_for(None, host=host)
    assert s.target.startswith("this host") and s.reduce_range == (host.arch == "x86_64" and not host.isa["vnni"])


def test_calibration_reader_strides_and_picks_across_classes():
    from edgetrain.int8.calibration import calibration_reader, stride_for
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    assert [stride_for(n) for n in (300, 7, 64, 1)] == [30, 7, 32, 1]
    ds = load_data("builtin:digits", Preprocess((1, 8, 8), mean=(0.0,), std=(1.0,)))
    picked = ds.sample(50)
    assert len(picked) == 50 and len(np.unique(picked.labels)) == ds.num_classes
    assert len(ds.sample(5000)) == len(ds)
    seen = []
    reader = calibration_reader(picked, "data", progress=lambda done, total: seen.append((done, total)))
    reader.set_range(10, 20)
    batches = list(iter(reader.get_next, None))
    assert len(batches) == 10 and batches[0]["data"].shape == (1, 1, 8, 8)
    assert np.array_equal(batches[0]["data"], picked.batch([10]))
    assert seen[-1] == (10, 50) and len(reader) == 50


@pytest.mark.parametrize("new,old,words", [
    (62_101, 62_191, "0.1% smaller"),       # dynamic int8 on the digits CNN: once "1.00x smaller" (issue 37)
    (62_191, 62_101, "0.1% larger"),
    (26_747, 61_250, "2.29x smaller"),
    (61_250, 21_437, "2.86x larger"),       # once "0.35x smaller"
    (100_000, 100_040, "<0.1% smaller"),
    (110, 100, "1.10x larger"),
    (100, 100, "the same size"),
])
def test_a_size_change_reads_the_right_way_round(new, old, words):
    from edgetrain.figures import Int8Size, compared

    assert compared(new, old, "smaller", "larger", "the same size") == words
    size = Int8Size.of(old, new)
    assert size.change == words and size.smaller == (new < old) and size.ratio == old / new


def test_no_ratio_below_one_is_ever_written():
    """Every pair of sizes (and latencies) on a grid: the figure before 'x' is at least 1.10, and the word
    says which way; a change under 10% is in percent."""
    import re

    from edgetrain.figures import compared

    values = [1, 7, 99, 100, 101, 109, 111, 1000, 25_000, 62_101, 62_191, 10**7]
    for new in values:
        for old in values:
            words = compared(new, old, "faster", "slower", "as fast")
            if new == old:
                assert words == "as fast"
                continue
            m = re.fullmatch(r"(<?[\d.]+)(x|%) (faster|slower)", words)
            assert m and m.group(3) == ("faster" if new < old else "slower"), (new, old, words)
            assert (m.group(2) == "x") == (max(new, old) / min(new, old) >= 1.1), (new, old, words)
            if m.group(2) == "x":
                assert float(m.group(1)) >= 1.1, (new, old, words)


@pytest.mark.parametrize("fp32,int8,words", [(61_250, 25_814, "(2.37x smaller than fp32)"),
                                             (61_250, 65_000, "(6.1% larger than fp32)"),
                                             (61_250, 71_000, "(1.16x larger than fp32)"),
                                             (62_191, 62_101, "(0.1% smaller than fp32)"),
                                             (60_000, 60_000, "(the same size as fp32)")])
def test_the_run_summary_says_which_way_the_int8_size_went(fp32, int8, words):
    """The run folder's summary rows (terminal, report.html and report.md all take them)."""
    from edgetrain.run_report import summary_rows

    rows = dict(summary_rows({"size_fp32_bytes": fp32, "size_int8_bytes": int8}))
    assert rows["size int8 ONNX"].endswith(words), rows
    assert "smaller" not in rows["size fp32 ONNX"]
