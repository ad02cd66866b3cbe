"""A full disk: every writer (--json, export and quantize output, model save, the disk feature cache,
temp files) fails with one line, keeps the old file, and leaves no temp file. Real tmpfs mounts."""
from __future__ import annotations

import numpy as np
import pytest

from clitools import assert_user_error
from edgetrain.errors import UsageError
from hostile import faults


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from edgetrain.convert import build_onnx
    from edgetrain.models import load_gluon, save_prefix

    root = tmp_path_factory.mktemp("disk-models")
    model = load_gluon("edgetrain.nets:pretrained_digits")  # trained: its int8 model is a real one
    save_prefix(model, root / "net")
    (root / "net.onnx").write_bytes(build_onnx(model, opset=13, dynamic_batch=True).SerializeToString())
    return root


@pytest.mark.parametrize("size", [100, 60_000, 900_000, 3_000_000])
@pytest.mark.parametrize("leave", [0, 50_000])
def test_atomic_write_on_a_full_disk_keeps_the_old_file(size, leave):
    from edgetrain.fileio import atomic_write_bytes

    with faults.tiny_disk("1m") as disk:
        target = disk / "out.bin"
        target.write_bytes(b"old")
        faults.fill(disk, leave=leave)
        try:
            atomic_write_bytes(target, bytes(size))
        except UsageError as exc:
            assert "no space left" in exc.line()
            assert target.read_bytes() == b"old"
        else:  # it fitted
            assert target.stat().st_size == size
        assert faults.temp_leftovers(disk) == []


def test_json_on_a_full_disk_is_one_line(models, cli):
    with faults.tiny_disk("1m") as disk:
        faults.fill(disk)
        res = cli("inspect", models / "net", "--json", disk / "r.json")
        assert_user_error(res, 2, "no space left", "r.json")
        assert faults.temp_leftovers(disk) == []


@pytest.mark.parametrize("command", ["export", "quantize"])
def test_model_output_on_a_full_disk_is_one_line(models, cli, command):
    with faults.tiny_disk("1m") as disk:
        (disk / "model.onnx").write_bytes(b"previous")
        faults.fill(disk, leave=4096)
        if command == "export":
            res = cli("export", models / "net", "-o", disk / "model.onnx")
        else:
            res = cli("quantize", models / "net.onnx", "--calib", "builtin:digits", "--samples", "16",
                      "-o", disk / "model.onnx")
        assert_user_error(res, 2, "no space left")
        assert (disk / "model.onnx").read_bytes() == b"previous"
        assert faults.temp_leftovers(disk) == []


def test_quantize_with_a_full_tmpdir_is_never_a_traceback(models, cli, tmp_path):
    """Python's tempfile skips a TMPDIR it cannot write a probe into (falls back to /tmp): either the run
    succeeds elsewhere, or it is one line; never a traceback, never a file left on the full disk."""
    with faults.tiny_disk("256k") as disk:
        faults.fill(disk)
        res = cli("quantize", models / "net.onnx", "--calib", "builtin:digits", "--samples", "16",
                  "-o", tmp_path / "q.onnx", env={"TMPDIR": str(disk)})
        if res.code != 0:  # TMPDIR is not the user's output: the run failed (1), and the line names it
            assert_user_error(res, 1, "no space left for temporary files", "TMPDIR")
            assert not (tmp_path / "q.onnx").exists()
        assert faults.temp_leftovers(disk) == []


def test_model_save_on_a_full_disk_is_one_line():
    from edgetrain.models import load_gluon, save_prefix

    model = load_gluon("edgetrain.nets:digits_cnn")
    with faults.tiny_disk("1m") as disk:
        faults.fill(disk, leave=20_000)
        with pytest.raises(UsageError, match="no space left"):
            save_prefix(model, disk / "model")
        assert faults.temp_leftovers(disk) == []
        assert not list(disk.glob("model-*"))


@pytest.mark.parametrize("rows", [10, 1000, 100_000])
def test_disk_feature_cache_checks_free_space_before_writing(rows):
    from edgetrain.training.featurecache import FeatureCache

    with faults.tiny_disk("1m") as disk:
        shape = (32, 4, 4)  # 2 kB a row
        need = rows * 32 * 16 * 4
        if need + (16 << 20) > (1 << 20):
            with pytest.raises(UsageError, match="disk feature cache needs"):
                FeatureCache(rows, shape, "disk", path=disk / "features.bin")
            assert not (disk / "features.bin").exists()
        else:  # pragma: no cover - every size here is over the 16 MB margin of a 1 MB disk
            FeatureCache(rows, shape, "disk", path=disk / "features.bin").close()


def test_feature_cache_write_on_a_disk_that_fills_is_one_line():
    """Free space checked at the start can vanish (another writer): the write itself is one line too."""
    from edgetrain.fileio import ensure_free_space  # noqa: F401 - the check this test goes around
    from edgetrain.training.featurecache import FeatureCache

    with faults.tiny_disk("2m") as disk:
        cache = FeatureCache.__new__(FeatureCache)
        import os

        cache.rows, cache.shape, cache.placement = 100, (64, 8, 8), "disk"
        cache.row_bytes, cache.path, cache._mem = 64 * 8 * 8 * 4, disk / "f.bin", None
        cache._fd = os.open(cache.path, os.O_RDWR | os.O_CREAT, 0o644)
        faults.fill(disk)
        with pytest.raises(UsageError, match="no space left"):
            for i in range(100):
                cache.write(i, np.ones((1, 64, 8, 8), np.float32))
        cache.close(delete=True)


@pytest.mark.parametrize("seed", ["-1", "4294967296", "99999999999999999999", "1e3", "abc"])
def test_seed_out_of_range_is_one_line(cli, models, tmp_path, seed):
    res = cli("finetune", models / "net", "--data", "builtin:digits", "-o", tmp_path / "ft", "--seed", seed)
    assert_user_error(res, 2, "--seed")
