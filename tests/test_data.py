"""DATA references: image folders, .npz and builtin:digits, preprocessed for the model."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain.data import load_data
from edgetrain.errors import UsageError
from edgetrain.preprocess import default_for_shape


def test_builtin_digits_is_the_real_uci_set():
    ds = load_data("builtin:digits", default_for_shape((1, 8, 8)))
    assert len(ds) == 1797 and ds.num_classes == 10
    assert np.bincount(ds.labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    x = ds.batch([0])
    # first sample of the UCI test set is a zero: its centre column is dark, its ring bright
    raw = ds._raw(0)[..., 0]
    assert 0.5 < raw.max() <= 1.0 and raw[3, 3] < raw[3, 2]
    assert x.shape == (1, 1, 8, 8)


def test_digits_resized_to_colour_model_input():
    pre = default_for_shape((3, 32, 32))
    x = load_data("builtin:digits", pre).batch([0, 5])
    assert x.shape == (2, 3, 32, 32)
    np.testing.assert_allclose(x[:, 0] * 0.229 + 0.485, x[:, 1] * 0.224 + 0.456, atol=1e-5)


def test_image_folder_mixed_formats_and_non_images(digits_folder):
    ds = load_data(str(digits_folder), default_for_shape((3, 16, 16)))
    assert ds.class_names == ["digit0", "digit1", "digit2"]
    assert len(ds) == 36 and ds.skipped == 1
    assert ds.batch(np.arange(36)).shape == (36, 3, 16, 16)
    gray = load_data(str(digits_folder), default_for_shape((1, 16, 16))).batch([1])  # a JPEG stored as RGB
    assert gray.shape == (1, 1, 16, 16)


def test_folder_errors(tmp_path):
    pre = default_for_shape((3, 8, 8))
    with pytest.raises(UsageError, match="no class sub-folders"):
        load_data(str(tmp_path), pre)
    (tmp_path / "only").mkdir()
    with pytest.raises(UsageError, match="1 class"):
        load_data(str(tmp_path), pre)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("hello")
    with pytest.raises(UsageError, match="no readable images"):
        load_data(str(tmp_path), pre)


def test_npz_layouts_and_class_names(tmp_path):
    rng = np.random.RandomState(0)
    f = tmp_path / "d.npz"
    np.savez(f, data=rng.randint(0, 255, (6, 3, 10, 10)).astype(np.uint8), label=np.array([0, 1, 2, 0, 1, 2]),
             class_names=np.array(["cat", "dog", "owl"]))
    ds = load_data(str(f), default_for_shape((3, 10, 10)))
    assert ds.class_names == ["cat", "dog", "owl"]
    assert ds.batch([0]).shape == (1, 3, 10, 10)


@pytest.mark.parametrize("arrays, fragment", [
    ({"data": np.zeros((4, 8, 8))}, "no 'label'"),
    ({"data": np.zeros((4, 8, 8)), "label": np.array([0, 1, 0])}, "4 samples but 'label' has 3"),
    ({"data": np.zeros((4, 8, 8)), "label": np.zeros(4)}, "1-D integer array"),
    ({"data": np.zeros((4, 8, 8)), "label": np.zeros(4, int)}, "1 class"),
    ({"data": np.zeros((4, 2, 2, 2, 2)), "label": np.array([0, 1, 0, 1])}, "expected images"),
])
def test_npz_errors(tmp_path, arrays, fragment):
    f = tmp_path / "bad.npz"
    np.savez(f, **arrays)
    with pytest.raises(UsageError, match=fragment):
        load_data(str(f), default_for_shape((1, 8, 8)))


def test_npz_with_objects_is_never_unpickled(tmp_path):
    f = tmp_path / "evil.npz"
    np.savez(f, data=np.array([{"a": 1}], dtype=object), label=np.array([0]))
    with pytest.raises(UsageError, match="never unpickles"):
        load_data(str(f), default_for_shape((1, 8, 8)))


def test_split_is_stratified_and_disjoint():
    ds = load_data("builtin:digits", default_for_shape((1, 8, 8)))
    train, val = ds.split(0.2, seed=1)
    assert len(train) + len(val) == len(ds)
    assert set(np.unique(val.labels)) == set(range(10))
    assert not set(train._index) & set(val._index)


def test_bad_references(tmp_path):
    pre = default_for_shape((1, 8, 8))
    with pytest.raises(UsageError, match="unknown built-in"):
        load_data("builtin:mnist", pre)
    with pytest.raises(UsageError, match="data not found"):
        load_data(str(tmp_path / "missing"), pre)
    (tmp_path / "x.csv").write_text("1,2")
    with pytest.raises(UsageError, match="unsupported data file"):
        load_data(str(tmp_path / "x.csv"), pre)


def _photo(path, size: int, seed: int = 0) -> None:
    from PIL import Image

    rng = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    rgb = np.stack([0.5 + 0.4 * np.sin((xx * np.cos(a) + yy * np.sin(a)) / rng.uniform(5, 40))
                    for a in rng.uniform(0, 3, 3)], -1) + rng.normal(0, 0.05, (size, size, 3))
    Image.fromarray((np.clip(rgb, 0, 1) * 255).astype(np.uint8)).save(path, quality=90)


def _full_decode(path, hw) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB").resize(hw[::-1], Image.BILINEAR), dtype=np.float32) / 255.0


def test_large_jpeg_is_decoded_at_reduced_size_with_nearly_the_same_pixels(tmp_path):
    """A JPEG much larger than the model's input is decoded in the DCT domain (Pillow's draft): the result
    has the model's shape and is within 0.005 mean / 0.03 max (on the 0..1 scale, i.e. ~1 and ~8 levels
    of 255) of a full decode + resize; it is not the full decode bit for bit (the fast path was taken)."""
    from edgetrain.data import read_image, unit_scale

    pre = default_for_shape((3, 40, 40))
    f = tmp_path / "big.jpg"
    _photo(f, 400)  # 10x the input: drafted to 1/4 (100 px, >= 2 x 40)
    got, want = unit_scale(read_image(f, pre)), _full_decode(f, pre.hw)
    assert got.shape == want.shape == (40, 40, 3) and read_image(f, pre).dtype == np.uint8
    diff = np.abs(got - want)
    assert diff.mean() < 0.005 and diff.max() < 0.03, (diff.mean(), diff.max())
    assert not np.array_equal(got, want)


def test_small_jpeg_and_png_decode_in_full(tmp_path):
    """No reduced decode when the image is not at least twice the input size, nor for other formats."""
    from PIL import Image

    from edgetrain.data import read_image, unit_scale

    pre = default_for_shape((3, 40, 40))
    _photo(tmp_path / "small.jpg", 60)
    _photo(tmp_path / "big.jpg", 400)
    Image.open(tmp_path / "big.jpg").save(tmp_path / "big.png")
    for name in ("small.jpg", "big.png"):
        assert np.array_equal(unit_scale(read_image(tmp_path / name, pre)), _full_decode(tmp_path / name, pre.hw)), name


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,hwc", [((3, 40, 56), (40, 56, 3)), ((1, 8, 8), (8, 8, 1)),
                                       ((3, 16, 16), (16, 16, 1)), ((1, 12, 10), (12, 10, 3)),
                                       ((3, 20, 24), (31, 17, 3))])
def test_model_input_is_bit_for_bit_the_plain_formula(shape, hwc, dtype):
    """to_model_input writes into the batch's row in place (no temporaries); its values stay exactly those
    of (x - mean) / std in float32 after the channel and size conversions, for every reader's precision."""
    from PIL import Image

    from edgetrain.data import to_model_input
    from edgetrain.preprocess import default_for_shape

    pre = default_for_shape(shape)
    img = np.random.RandomState(3).rand(*hwc).astype(dtype)
    x = img
    if x.shape[2] != shape[0]:
        x = (x[..., :3] @ np.array([0.299, 0.587, 0.114], np.float32))[..., None] if shape[0] == 1 \
            else np.repeat(x[..., :1], 3, axis=2)
    if x.shape[:2] != shape[1:]:
        x = np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(x[..., c], dtype=np.float32), mode="F")
                                 .resize(shape[:0:-1], Image.BILINEAR)) for c in range(x.shape[2])], axis=2)
    want = ((x - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)).transpose(2, 0, 1)
    got = to_model_input(img, pre)
    assert got.dtype == np.float32 and got.shape == shape
    assert np.array_equal(got, want.astype(np.float32))
    # a float64 reader gives what its float32 pixels give (resizing it read float64 bytes as float32: garbage)
    np.testing.assert_allclose(got, to_model_input(img.astype(np.float32), pre), rtol=1e-5, atol=1e-5)
    row = np.full((2, *shape), np.nan, np.float32)
    assert to_model_input(img, pre, row[1]) is not None and np.array_equal(row[1], got)
    assert np.isnan(row[0]).all()  # only the given row is written


@pytest.mark.parametrize("shape,hwc", [((3, 40, 56), (40, 56, 3)), ((1, 8, 8), (8, 8, 1)),
                                       ((3, 16, 16), (16, 16, 1)), ((1, 12, 10), (12, 10, 3)),
                                       ((3, 20, 24), (31, 17, 3))])
def test_an_8bit_image_gives_the_bits_of_its_float_pixels(shape, hwc):
    """An image file is read as uint8 (its float copy and /255 array cost 0.2 ms a 160x160 image); the model
    input is bit for bit what float32(pixel) / 255 gives, at the model's size or converted."""
    from edgetrain.data import to_model_input, unit_scale
    from edgetrain.preprocess import default_for_shape

    pre = default_for_shape(shape)
    img = np.random.RandomState(5).randint(0, 256, hwc).astype(np.uint8)
    as_float = img.astype(np.float32) / 255.0  # what the reader gave before
    assert np.array_equal(unit_scale(img), as_float) and unit_scale(as_float) is as_float
    row = np.full((2, *shape), np.nan, np.float32)
    to_model_input(img, pre, row[0])
    assert np.array_equal(row[0], to_model_input(as_float, pre)) and np.isnan(row[1]).all()


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_a_parallel_read_is_the_batch_and_its_errors_name_the_file(tmp_path, threads):
    """ParallelReader splits a batch's rows between threads: the same array as Dataset.batch for any row
    count (fewer rows than threads included); an image that cannot be decoded is one UsageError naming it,
    from whichever thread read it, and every helper has finished when it is raised."""
    from PIL import Image

    from edgetrain.data import ParallelReader, load_data
    from edgetrain.errors import UsageError
    from edgetrain.preprocess import default_for_shape

    rng = np.random.RandomState(1)
    for cls in ("a", "b"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for k in range(7):
            Image.fromarray(rng.randint(0, 256, (30, 20, 3), dtype=np.uint8)).save(tmp_path / "imgs" / cls / f"{k}.png")
    pre = default_for_shape((3, 16, 16))
    ds = load_data(str(tmp_path / "imgs"), pre)
    reader = ParallelReader(threads)
    try:
        for n in (1, 2, 3, 8, 14):
            idx = np.arange(14)[::-1][:n]
            assert np.array_equal(reader.batch(ds, idx), ds.batch(idx))
        for victim in (0, 13):  # read by this thread, and by a helper
            path = tmp_path / "imgs" / ("a" if victim < 7 else "b") / f"{victim % 7}.png"
            good = path.read_bytes()
            path.write_bytes(good[: len(good) // 2])  # passed the scan, fails to decode now
            try:
                with pytest.raises(UsageError, match="cannot be decoded") as info:
                    reader.batch(ds, np.arange(14))
                assert str(path) in info.value.line()
            finally:
                path.write_bytes(good)
    finally:
        reader.close()
