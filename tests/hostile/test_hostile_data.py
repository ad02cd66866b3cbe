"""Hostile DATA: every bad .npz or image is a one-line error (exit 2) at load, never a silent wrong
answer, a traceback mid-run or an allocation the input's size did not earn."""
from __future__ import annotations

import time

import numpy as np
import pytest

from clitools import assert_user_error
from edgetrain.data import load_data
from edgetrain.errors import EdgetrainError, UsageError
from edgetrain.preprocess import default_for_shape
from hostile import faults, gen

PRE = default_for_shape((1, 6, 6))
NONFINITE = list(gen.nonfinite_cases())


@pytest.mark.parametrize("case", NONFINITE, ids=[c[0] for c in NONFINITE])
def test_nonfinite_pixels_refused_at_load(tmp_path, case):
    _id, data, labels = case
    f = gen.write_npz(tmp_path / "d.npz", data=data, label=labels)
    with pytest.raises(UsageError, match="non-finite values"):
        load_data(str(f), PRE)


def test_nonfinite_pixels_cli_exit_2(tmp_path, cli, tiny_prefix):
    data = np.random.RandomState(0).rand(8, 16, 16).astype("float32")
    data[3, 4, 5] = np.nan
    f = gen.write_npz(tmp_path / "nan.npz", data=data, label=gen.labels())
    res = cli("inspect", tiny_prefix, "--data", f)
    assert_user_error(res, 2, "non-finite", "nan.npz")


SCALED = list(gen.scaled_cases())


@pytest.mark.parametrize("case", SCALED, ids=[c[0] for c in SCALED])
def test_pixel_scale_follows_the_documented_rule_and_is_stated(tmp_path, case):
    _id, data, factor = case
    f = gen.write_npz(tmp_path / "d.npz", data=data, label=gen.labels())
    ds = load_data(str(f), PRE)
    raw = ds.raw_batch(np.arange(len(ds)))[..., 0]
    np.testing.assert_allclose(raw, data.astype(np.float64) * factor, rtol=1e-3, atol=1e-6)
    assert 0.0 <= raw.min() and raw.max() <= 1.0
    assert any(n.startswith("pixel scale:") and str(data.dtype) in n for n in ds.notes), ds.notes


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint16"])
def test_npz_states_its_own_scale(tmp_path, dtype):
    data = (np.arange(8 * 36).reshape(8, 6, 6) % 100).astype(dtype)  # 0..99, e.g. percent
    f = gen.write_npz(tmp_path / "d.npz", data=data, label=gen.labels(), scale=np.float64(0.01))
    ds = load_data(str(f), PRE)
    np.testing.assert_allclose(ds.raw_batch([1])[0, ..., 0], data[1] * 0.01, rtol=1e-6)
    assert any("'scale'" in n for n in ds.notes)
    bad = gen.write_npz(tmp_path / "bad.npz", data=data, label=gen.labels(), scale=np.float64(1.0))
    with pytest.raises(UsageError, match="outside 0..1"):
        load_data(str(bad), PRE)
    for s in (0.0, -1.0, np.nan, np.array([0.1, 0.2])):
        bad = gen.write_npz(tmp_path / "bad2.npz", data=data, label=gen.labels(), scale=np.asarray(s))
        with pytest.raises(UsageError, match="'scale'"):
            load_data(str(bad), PRE)


UNSCALABLE = list(gen.unscalable_cases())


@pytest.mark.parametrize("case", UNSCALABLE, ids=[c[0] for c in UNSCALABLE])
def test_data_on_no_pixel_scale_refused(tmp_path, case):
    _id, data = case
    f = gen.write_npz(tmp_path / "d.npz", data=data, label=gen.labels())
    with pytest.raises(UsageError, match="not pixels"):
        load_data(str(f), PRE)


HUGE_LABELS = [c for c in gen.huge_label_cases() if c[0] != "label-3"]


@pytest.mark.parametrize("case", HUGE_LABELS, ids=[c[0] for c in HUGE_LABELS])
def test_label_beyond_class_count_refused_before_allocating(tmp_path, case):
    _id, labels, names = case
    arrays = {"data": np.zeros((8, 6, 6), np.uint8), "label": labels}
    if names is not None:
        arrays["class_names"] = names
    f = gen.write_npz(tmp_path / "d.npz", **arrays)
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="label|class_names"):
        load_data(str(f), PRE)
    assert time.monotonic() - t0 < 30  # generous: an allocation of 10^9 names would not end at all


@pytest.mark.parametrize("top", [2, 3, 10, 10**9])
def test_label_checked_against_the_models_class_count(tmp_path, top):
    labels = gen.labels(8, 2).astype(np.int64)
    labels[-1] = top
    f = gen.write_npz(tmp_path / "d.npz", data=np.zeros((8, 6, 6), np.uint8), label=labels)
    with pytest.raises(UsageError, match="out of range for a model with 2 classes"):
        load_data(str(f), PRE, num_classes=2)
    with pytest.raises(UsageError, match="out of range for a model with 2 classes"):
        load_data("builtin:digits", default_for_shape((1, 8, 8)), num_classes=2)


@pytest.mark.parametrize("shape", [(1000000, 224, 224, 3), (2**31, 2**31), (4, 2**40)])
def test_lying_npy_header_refused_from_the_header(tmp_path, shape):
    f = gen.lying_npz(tmp_path / "lie.npz", claimed_shape=shape)
    with pytest.raises(UsageError, match="claims|allowed"):
        load_data(str(f), PRE)


def test_compressed_bomb_refused_before_reading(tmp_path):
    f = gen.bomb_npz(tmp_path / "bomb.npz", mbytes=256)
    assert f.stat().st_size < 4 << 20
    with pytest.raises(UsageError, match=r"take 256 MB once read.*over the 64 MB allowed"):
        load_data(str(f), PRE, max_bytes=64 << 20)


@pytest.mark.slow
def test_compressed_bomb_within_a_memory_limit(tmp_path):
    """A 1 GiB bomb read in a child whose address space is bounded: refused from its header (the
    default budget follows RLIMIT_AS), never a MemoryError or the kernel's OOM kill."""
    f = gen.bomb_npz(tmp_path / "bomb.npz", mbytes=1024)
    code = ("import sys\nfrom edgetrain.data import load_data\nfrom edgetrain.preprocess import default_for_shape\n"
            "from edgetrain.errors import UsageError\n"
            f"try:\n    load_data({str(f)!r}, default_for_shape((1, 256, 256)))\n"
            "except UsageError as e:\n    print('REFUSED', e.line()); sys.exit(2)\n")
    res = faults.run_python_limited(code, 900 << 20)
    assert res.returncode == 2 and "REFUSED" in res.stdout and "allowed" in res.stdout, res.stderr[-2000:]


def test_corrupt_npz_is_one_line(tmp_path):
    rng = np.random.RandomState(3)
    good = gen.write_npz(tmp_path / "good.npz", compress=True, data=rng.randint(0, 255, (64, 8, 8)).astype(np.uint8),
                         label=gen.labels(64))
    for case_id, path in gen.corrupt_npz_cases(tmp_path, good):
        with pytest.raises(UsageError) as info:
            load_data(str(path), PRE).raw_batch(np.arange(64))
        assert "\n" not in info.value.line() and len(info.value.line()) < 700, case_id


# --- images -------------------------------------------------------------------------------------------

OVERSIZED = list(gen.oversized_image_cases())


@pytest.mark.parametrize("case", OVERSIZED, ids=[c[0] for c in OVERSIZED])
def test_image_over_the_pixel_limit_refused_before_decode(tmp_path, case):
    case_id, data = case
    ext = ".jpg" if case_id.startswith("jpeg") else ".png"
    root = gen.image_folder(tmp_path / "imgs", {"bomb" + ext: data})
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="pixel limit|over the limit") as info:
        load_data(str(root), default_for_shape((1, 16, 16)))
    assert "bomb" + ext in info.value.line()
    assert time.monotonic() - t0 < 20


UNDECODABLE = list(gen.undecodable_image_cases())


@pytest.mark.parametrize("case", UNDECODABLE, ids=[c[0] for c in UNDECODABLE])
def test_undecodable_image_is_skipped_or_one_line_never_a_traceback(tmp_path, case):
    case_id, data = case
    ext = ".jpg" if case_id.startswith("jpeg") else ".png"
    root = gen.image_folder(tmp_path / "imgs", {"broken" + ext: data})
    ds = load_data(str(root), default_for_shape((3, 16, 16)))
    if ds.skipped:  # caught by the scan: skipped and counted
        assert len(ds) == 8 and any("skipped" in n for n in ds.notes)
        return
    assert len(ds) == 9
    with pytest.raises(UsageError, match="cannot be decoded") as info:
        ds.batch(np.arange(len(ds)))
    assert "broken" + ext in info.value.line()


def test_image_error_mid_run_is_one_line_in_the_cli(tmp_path, cli, tiny_prefix):
    root = gen.image_folder(tmp_path / "imgs", {"broken.jpg": gen.good_jpeg(64, 64)[:-200]})
    res = cli("export", tiny_prefix, "-o", tmp_path / "m.onnx", "--data", root)
    if res.code == 0:  # PIL decoded the truncated tail (it pads short JPEG scans): nothing to report
        return
    assert_user_error(res, 2, "broken.jpg")


# --- error lines are bounded --------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1000, 100_000, 3_000_000])
def test_error_lines_never_embed_unbounded_input(n):
    big = "x" * n + "\n" + "y" * n
    for exc in (UsageError(big, big, big), UsageError("bad " + big), EdgetrainError("a", big)):
        line = exc.line()
        assert len(line) < 1000 and "\n" not in line
    with pytest.raises(UsageError) as info:
        load_data("builtin:" + "z" * n, PRE)
    assert len(info.value.line()) < 1000


@pytest.mark.slow
def test_finetune_refuses_a_bomb_over_its_memory_budget_up_front(tmp_path, cli, tiny_prefix):
    """Issue 12: a 3 MB .npz expanding to 2.7 GB was read whole before the budget refused it. Now the
    npy header is checked against --memory-budget before anything is read."""
    f = gen.bomb_npz(tmp_path / "bomb.npz", mbytes=2048)
    assert f.stat().st_size < 16 << 20
    t0 = time.monotonic()
    res = cli("finetune", tiny_prefix, "--data", f, "-o", tmp_path / "ft", "--memory-budget", "1500MB", "--epochs", "1")
    assert_user_error(res, 2, "2,048 MB once read", "1,500 MB allowed")
    assert time.monotonic() - t0 < 60
