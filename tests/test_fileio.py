"""Outputs are written whole or not at all, with a normal file mode."""
from __future__ import annotations

import os

import pytest

from edgetrain.errors import UsageError
from edgetrain.fileio import atomic_path, atomic_write_text


def test_failure_leaves_old_file_and_no_temp(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_written_file_has_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644


def test_directory_and_missing_folder_refused(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        atomic_write_text(tmp_path, "x")
    with pytest.raises(UsageError, match="folder does not exist"):
        atomic_write_text(tmp_path / "nope" / "a.txt", "x")
