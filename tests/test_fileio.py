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


def test_a_remembered_digest_is_the_files_digest_until_the_file_changes_in_any_way(tmp_path):
    import json
    import time

    from edgetrain.fileio import MEMO_SETTLED_NS, file_digest, remembered_digest

    memo = tmp_path / "cache" / "digests.json"
    f = tmp_path / "weights.params"
    f.write_bytes(b"a" * 100_000)
    fresh = remembered_digest(f, memo)
    assert fresh == file_digest(f) and not memo.exists()  # changed just now: not remembered yet
    time.sleep(MEMO_SETTLED_NS / 1e9 + 0.1)
    assert remembered_digest(f, memo) == fresh
    entry = json.loads(memo.read_text())[str(f.resolve())]
    assert entry[-1] == fresh
    # the memo is what answers while the file is unchanged (proved by a planted digest)...
    planted = "0" * 64
    memo.write_text(json.dumps({str(f.resolve()): entry[:-1] + [planted]}))
    assert remembered_digest(f, memo) == planted
    # ...and never once the file changed: the same size with its old times put back, a rename over it, a touch
    st = f.stat()
    f.write_bytes(b"b" * 100_000)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert remembered_digest(f, memo) == file_digest(f) != fresh
    other = tmp_path / "other"
    other.write_bytes(b"a" * 100_000)
    os.replace(other, f)
    assert remembered_digest(f, memo) == fresh
    # no memo (no cache folder) or an unreadable one: always hashed
    assert remembered_digest(f, None) == fresh
    memo.write_text("{not json")
    assert remembered_digest(f, memo) == fresh


def test_the_digest_memo_stays_bounded(tmp_path, monkeypatch):
    import json
    import time

    from edgetrain import fileio

    monkeypatch.setattr(fileio, "MEMO_ENTRIES", 3)  # the bound's size only; the logic is the real one
    files = []
    for i in range(5):
        files.append(tmp_path / f"f{i}")
        files[-1].write_bytes(bytes([i]) * 10)
    time.sleep(fileio.MEMO_SETTLED_NS / 1e9 + 0.1)
    memo = tmp_path / "digests.json"
    for f in files:
        fileio.remembered_digest(f, memo)
    assert list(json.loads(memo.read_text())) == [str(f.resolve()) for f in files[-3:]]
