"""The tune run's journal: one JSON line per fact (the run's fingerprint, a trial's rung result, a latency
measured), appended and fsync'ed before the run goes on, never rewritten. A resume replays it: what is in it is
not run again, and the schedule's decisions, made from the same facts, come out the same. A line cut short by
a power cut is the last one, and is ignored (its fact is measured again).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

FILENAME = "journal.jsonl"
FORMAT = "edgetrain-tune-journal/1"


class Journal:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.records: list[dict] = []
        self.tail_checked = False   # a torn last line comes only from an earlier process: looked for once

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

    def append(self, record: dict) -> None:
        line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
        if not self.tail_checked and self.path.exists() and self.path.stat().st_size:
            with open(self.path, "rb") as fh:  # a torn last line (power cut) is cut off before the next fact
                fh.seek(-1, os.SEEK_END)
                torn = fh.read(1) != b"\n"
            if torn:
                data = self.path.read_bytes()
                keep = data[:data.rfind(b"\n") + 1]
                with open(self.path, "r+b") as fh:
                    fh.truncate(len(keep))
        self.tail_checked = True
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.records.append(record)

    def find(self, kind: str, **match) -> dict | None:
        for record in reversed(self.records):
            if record.get("kind") == kind and all(record.get(k) == v for k, v in match.items()):
                return record
        return None
