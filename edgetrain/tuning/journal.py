"""The tune run's journal: one JSON line per fact (the run's fingerprint, a trial's rung result, a latency
measured), appended and never rewritten. A resume replays it: what is in it is not run again, and the schedule's
decisions, made from the same facts, come out the same. A line cut short by a power cut is the last one, and is
ignored (its fact is measured again).

A line is written at once (a kill -9 never loses it) and fsync'ed on a thread of its own, beside the work that
follows; ``sync()`` waits for it. The tuner waits before the next trial's job writes its first checkpoint (the
job's ``before_checkpoint``: the next trial-epoch boundary), before the next line and before its outputs, so no
checkpoint on the disk is ahead of a fact it builds on. A power cut before that wait may lose the last line: its
trial's checkpoint already holds that rung, and the resume measures it again with no epoch trained (what a cut
between that checkpoint and the line's fsync always did). The file's folder is fsync'ed once, when it is made.
Waiting for each fsync cost bench_tune's default run 59 ms of 5.0 s (23 lines, load 3.9), 1.2% of it.
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..fileio import fsync_dir

FILENAME = "journal.jsonl"
FORMAT = "edgetrain-tune-journal/1"


class Journal:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.records: list[dict] = []
        self.tail_checked = False   # a torn last line comes only from an earlier process: looked for once
        self._fsyncs: ThreadPoolExecutor | None = None   # one thread, made at the first line (close() ends it)
        self._syncing: Future | None = None   # the fsync of the lines written last
        self.waited = 0.0   # seconds the run waited for an fsync (sync())

    def exists(self) -> bool:
        return self.path.is_file()

    def read(self) -> list[dict]:
        self.records = []
        try:
            lines = self.path.read_bytes().split(b"\n")
        except FileNotFoundError:
            return self.records
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:  # torn by a power cut: only ever the last line
                break
            if isinstance(record, dict):
                self.records.append(record)
        return self.records

    def header(self) -> dict | None:
        first = self.records[0] if self.records else None
        return first if first and first.get("format") == FORMAT else None

    def append(self, *records: dict) -> None:
        """``records``, one line each, written in one go; their fsync runs on a thread until ``sync()``."""
        self.sync()
        data = b"".join((json.dumps(r, sort_keys=True, default=str) + "\n").encode() for r in records)
        if not self.tail_checked and self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as fh:  # a torn last line (power cut) is cut off before the next fact
                fh.seek(-1, os.SEEK_END)
                torn = fh.read(1) != b"\n"
            if torn:
                old = self.path.read_bytes()
                keep = old[:old.rfind(b"\n") + 1]
                with open(self.path, "r+b") as fh:
                    fh.truncate(len(keep))
        self.tail_checked = True
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        except BaseException:
            os.close(fd)
            raise
        if self._fsyncs is None:
            self._fsyncs = ThreadPoolExecutor(1, thread_name_prefix="journal-fsync")
        self._syncing = self._fsyncs.submit(self._fsync, fd, created)
        self.records.extend(records)

    def _fsync(self, fd: int, created: bool) -> None:
        try:
            os.fsync(fd)
            if created:
                fsync_dir(self.path.parent)
        finally:
            os.close(fd)

    def sync(self) -> None:
        """Wait until every line written is on the disk (an fsync's error is raised here)."""
        if self._syncing is None:
            return
        t0 = time.monotonic()
        try:
            self._syncing.result()
        finally:
            self.waited += time.monotonic() - t0
            self._syncing = None

    def close(self) -> None:
        """Wait for the last fsync (its error is raised) and end the fsync thread."""
        try:
            self.sync()
        finally:
            if self._fsyncs is not None:
                self._fsyncs.shutdown()
                self._fsyncs = None

    def find(self, kind: str, **match) -> dict | None:
        for record in reversed(self.records):
            if record.get("kind") == kind and all(record.get(k) == v for k, v in match.items()):
                return record
        return None
