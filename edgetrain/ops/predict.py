"""`edgetrain predict MODEL DATA`: classify with the ONNX file alone, as the device will.

MODEL is an ONNX file written by edgetrain (``export`` or ``quantize``; fp32, fp16 or int8); its metadata
carries the preprocessing (input size, channels, mean/std) and the class names, and exactly that
preprocessing is applied. DATA is an image folder (one sub-folder per class: labelled; images directly
in it: unlabelled), one image file, an ``.npz`` (``data`` and ``label``), ``builtin:digits``, or ``-``:
image paths on standard input, one per line.

Only ONNX Runtime, NumPy and Pillow are loaded: never mxnet, never the ``onnx`` package (the metadata is
read from the ONNX Runtime session), so it starts fast and small on a Pi Zero 2 W. Inputs are decoded and
run ``batch`` at a time; the result has each input's top-k labels and scores, with labels the top-1 and
top-k accuracy and a confusion summary, and the throughput and per-batch latency.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..data import IMAGE_SUFFIXES, load_data, read_image, to_model_input
from ..errors import UsageError, clip
from ..preprocess import Preprocess
from ..results import Figure, ProgressFn, Result, report
from ..runners import OrtRunner
from ..runtime import current_threads

if TYPE_CHECKING:
    from ..options import PredictOptions

STDIN = "-"
# Standard input is read to its end before the first image: an endless stream (`yes PATH`, /dev/zero) must
# end in one line, not in a hang or a MemoryError. A million paths is more than one run should take; a
# line longer than PATH_MAX (4096 bytes on Linux) is not a path.
MAX_PATH_LINES = 1_000_000
MAX_PATH_LINE_BYTES = 4096


@dataclass
class PredictResult(Result):
    model: str
    data: str
    precision: str                 # fp32 | fp16 | int8 (<scheme>)
    samples: int
    top_k: int
    batch: int
    threads: int
    classes: list[str] | None      # the model's class names (None: it recorded none; indices are shown)
    predictions: list[dict]        # {input, label?, top: [{label, index, score}]}
    accuracy: PredictAccuracy | None  # with labels
    timing: PredictTiming
    notes: list[str] = field(default_factory=list)


@dataclass
class PredictTiming(Figure):
    load_s: float
    first_result_s: float
    images_per_s: float | None             # end to end: decoding and inference
    inference_images_per_s: float | None
    decode_s: float
    batch_p50_ms: float
    batch_p90_ms: float
    batches: int
    per_image_ms: float


@dataclass
class ClassRecall(Figure):
    label: str
    index: int | None                      # in the model's numbering (None: a class the model does not have)
    samples: int
    correct: int
    recall: float                          # %
    most_confused_with: str | None
    confused_count: int


@dataclass
class Confusion(Figure):
    label: str
    predicted: str
    count: int


@dataclass
class PredictAccuracy(Figure):
    samples: int
    top1: float                            # %
    topk: float                            # % top-k; its key is "top<k>" ("top5")
    k: int
    per_class: list[ClassRecall]
    confusion: list[Confusion]

    def to_dict(self) -> dict:
        d = super().to_dict()
        return {"samples": d["samples"], "top1": d["top1"], f"top{self.k}": d["topk"], "k": self.k,
                "per_class": d["per_class"], "confusion": d["confusion"]}


@dataclass
class _Source:
    """What DATA resolved to: ``count`` inputs, decoded ``batch(idx)`` at a time."""

    text: str
    names: list[str]
    batch: Callable[[np.ndarray], np.ndarray]
    labels: np.ndarray | None = None       # in the DATA's own numbering
    class_names: list[str] | None = None   # the DATA's classes (labelled sources)
    notes: list[str] = field(default_factory=list)
    files: list[Path] | None = None        # the image files read (folders, one file, standard input)


def predict(model: str, data: str, opts: "PredictOptions", progress: ProgressFn | None = None,
            on_rows: Callable[[list[dict]], None] | None = None, stdin=None,
            outputs: dict | None = None) -> PredictResult:
    """Classify DATA with the ONNX MODEL; ``on_rows`` receives each batch's predictions as they are made.
    ``outputs`` (option -> path) are refused, before any inference, if one is an image DATA names (inside
    its folder, or listed on standard input)."""
    t0 = time.perf_counter()
    threads = current_threads()  # the cap applied for these options (runtime.apply_threads)
    runner, pre, classes, precision, notes = _load(model, threads)
    t_load = time.perf_counter() - t0
    src = _resolve(str(data), pre, stdin if stdin is not None else sys.stdin)
    if outputs and src.files:
        from ..fileio import check_outputs_not_files

        check_outputs_not_files(outputs, src.files, "input image")
    notes += src.notes
    n = len(src.names)
    if n == 0:
        raise UsageError("no images to classify", str(data), "give an image folder, image files, an .npz, "
                         "or image paths on standard input with DATA '-'")
    num_out = _num_outputs(runner, pre)
    labels, truth_names = _model_labels(src, classes, num_out, notes) if src.labels is not None else (None, None)
    k = min(opts.top_k, num_out) if num_out else opts.top_k
    if num_out and opts.top_k > num_out:
        notes.append(f"--top-k {opts.top_k} is more than the model's {num_out} classes: showing {num_out}")

    rows: list[dict] = []
    kept = Rows(opts.format) if opts.output is not None else None  # -o: written whole once every batch is done
    batch_ms: list[float] = []
    top1_hits = topk_hits = 0
    confusion: dict[tuple[int, int], int] = {}
    first_s = None
    t_run = time.perf_counter()
    decode_s = 0.0
    probabilities = None
    for start in range(0, n, opts.batch):
        idx = np.arange(start, min(start + opts.batch, n))
        td = time.perf_counter()
        x = src.batch(idx)
        ti = time.perf_counter()
        decode_s += ti - td
        scores = _infer(runner, x, model)
        batch_ms.append((time.perf_counter() - ti) * 1000.0)
        if first_s is None:
            first_s = time.perf_counter() - t0
        if probabilities is None:
            probabilities = _are_probabilities(scores)
            if not probabilities:
                notes.append("scores are the softmax of the model's outputs")
        probs = scores if probabilities else _softmax(scores)
        top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        batch_rows = []
        for j, i in enumerate(idx):
            row = {"input": src.names[i]}
            if labels is not None:
                truth = int(labels[i])
                row["label"] = truth_names[i]
                top1_hits += int(top[j, 0] == truth)
                topk_hits += int(truth in top[j])
                key = (truth_names[i], truth, int(top[j, 0]))
                confusion[key] = confusion.get(key, 0) + 1
            row["top"] = [{"label": _name(classes, int(c)), "index": int(c), "score": round(float(probs[j, c]), 6)}
                          for c in top[j]]
            batch_rows.append(row)
        rows.extend(batch_rows)
        if kept is not None:
            kept.add(batch_rows)
        if on_rows is not None:
            on_rows(batch_rows)
        report(progress, "predict", int(idx[-1]) + 1, n)
    wall = time.perf_counter() - t_run
    ms = np.asarray(batch_ms)
    full = ms[:-1] if len(ms) > 1 and n % opts.batch else ms  # a short last batch is not a batch's latency
    timing = PredictTiming(load_s=round(t_load, 4), first_result_s=round(first_s or 0.0, 4),
                           images_per_s=n / wall if wall > 0 else None,
                           inference_images_per_s=n / (ms.sum() / 1000.0) if ms.sum() > 0 else None,
                           decode_s=round(decode_s, 4), batch_p50_ms=float(np.percentile(full, 50)),
                           batch_p90_ms=float(np.percentile(full, 90)), batches=len(ms),
                           per_image_ms=float(np.percentile(full, 50)) / min(opts.batch, n))
    if kept is not None:
        from ..fileio import atomic_write_text

        atomic_write_text(Path(opts.output), kept.text(), what="-o")
    accuracy = None
    if labels is not None:
        accuracy = _accuracy(labels, confusion, top1_hits, topk_hits, k, classes)
    return PredictResult(model=str(model), data=str(data), precision=precision, samples=n, top_k=k,
                         batch=opts.batch, threads=threads, classes=classes, predictions=rows, accuracy=accuracy,
                         timing=timing, notes=notes)


class Rows:
    """Predictions in ``--format``: each batch's lines go to ``sink`` as they are made (the CLI's stdout),
    or are kept for ``-o``."""

    def __init__(self, fmt: str, sink: Callable[[list[str]], None] | None = None):
        self.fmt, self.sink = fmt, sink
        self.header_done = False
        self.kept: list[str] = []
        self.rows = 0

    def add(self, rows: list[dict]) -> None:
        lines = []
        if not self.header_done and rows:
            lines += self._header(rows[0])
            self.header_done = True
        lines += [self._line(r) for r in rows]
        if self.sink is not None:
            self.sink(lines)
        else:
            self.kept.extend(lines)

    def text(self) -> str:
        return "".join(line + "\n" for line in self.kept + self.end())

    def end(self) -> list[str]:
        """The lines after the last row: json's closing bracket (an empty array when no row came)."""
        if self.fmt != "json":
            return []
        return ["]"] if self.header_done else ["[]"]

    def _header(self, row: dict) -> list[str]:
        k = len(row["top"])
        if self.fmt == "csv":
            cols = ["input"] + (["label"] if "label" in row else [])
            cols += [c for i in range(1, k + 1) for c in (f"top{i}_label", f"top{i}_score")]
            return [_csv(cols)]
        if self.fmt == "table":
            return ["input" + ("\tlabel" if "label" in row else "") + "\t" + f"top-{k} (score)"]
        if self.fmt == "json":
            return ["["]
        return []

    def _line(self, row: dict) -> str:
        if self.fmt == "jsonl":
            return json.dumps(row)
        if self.fmt == "json":  # one array, written as the rows come: a comma before every row but the first
            self.rows += 1
            return (" " if self.rows == 1 else ",") + json.dumps(row)
        if self.fmt == "csv":
            cols = [row["input"]] + ([row["label"]] if "label" in row else [])
            cols += [v for t in row["top"] for v in (t["label"], f"{t['score']:.6f}")]
            return _csv(cols)
        top = "  ".join(f"{t['label']} {t['score']:.3f}" for t in row["top"])
        return row["input"] + (f"\t{row['label']}" if "label" in row else "") + "\t" + top


def _csv(cols) -> str:
    import csv  # only for --format csv
    import io

    buf = io.StringIO()
    # the terminator's characters are what the writer quotes a field for (a file name may hold \n or \r):
    # with "" a name with a line break split its row in two for every CSV reader
    csv.writer(buf, lineterminator="\r\n").writerow(cols)
    return buf.getvalue()[:-2]


# --- the model ---------------------------------------------------------------------------------------------

def _load(model: str, threads: int):
    """(runner, preprocessing, class names, precision, notes) from the ONNX file's own metadata."""
    path = Path(model)
    if path.suffix.lower() != ".onnx":
        raise UsageError("predict takes an ONNX file written by edgetrain", model,
                         "export the model first: `edgetrain export MODEL -o model.onnx` (or quantize it)")
    if not path.is_file():
        raise UsageError("ONNX file not found", model, "check the path")
    try:
        runner = OrtRunner(path, threads)
    except Exception as exc:  # ORT's InvalidProtobuf / Fail: the file is not a model it can run
        raise UsageError(f"ONNX Runtime cannot load the model: {clip(str(exc).splitlines()[0], 200)}", model,
                         "give an .onnx file written by `edgetrain export` or `edgetrain quantize`") from None
    meta = dict(runner.session.get_modelmeta().custom_metadata_map)
    if "edgetrain.preprocess" not in meta:
        raise UsageError("ONNX file has no edgetrain preprocessing record (metadata 'edgetrain.preprocess')", model,
                         "export it with `edgetrain export` (or quantize it with `edgetrain quantize`)")
    try:
        from ..fileio import parse_json

        record = parse_json(meta["edgetrain.preprocess"])
    except ValueError as exc:
        raise UsageError(f"malformed edgetrain metadata 'edgetrain.preprocess': {clip(str(exc), 100)}", model,
                         "export the model again with `edgetrain export`") from None
    if not isinstance(record, dict):
        raise UsageError("malformed edgetrain metadata 'edgetrain.preprocess': not a JSON object", model,
                         "export the model again with `edgetrain export`")
    pre = Preprocess.from_dict(record, f"{model} metadata 'edgetrain.preprocess'")
    classes = list(pre.class_names) if pre.class_names is not None else None
    notes = []
    if meta.get("edgetrain.random_weights") == "true":
        notes.append("the model was exported with random weights: its predictions mean nothing")
    precision = meta.get("edgetrain.precision", "fp32")
    if "edgetrain.quantization" in meta:
        try:
            from ..fileio import parse_json

            record = parse_json(meta["edgetrain.quantization"])
            precision = record.get("precision", "int8")
            precision = f"{precision} ({record.get('scheme', 'QDQ')})" if precision == "int8" else \
                f"{precision} (measured faster than int8 here)"
        except (ValueError, AttributeError):
            precision = "int8"
    return runner, pre, classes, precision, notes


def _num_outputs(runner: OrtRunner, pre: Preprocess) -> int:
    """The class count the model declares (0 if its output width is symbolic)."""
    shape = runner.session.get_outputs()[0].shape
    last = shape[-1] if shape else None
    return int(last) if isinstance(last, int) and last > 0 else 0


def _infer(runner: OrtRunner, x: np.ndarray, model: str) -> np.ndarray:
    try:
        out = runner.infer(x)
    except Exception as exc:  # the data does not fit (an input shape the file does not take)
        raise UsageError(f"the model cannot run these inputs: {clip(str(exc).splitlines()[0], 200)}", model,
                         "give data of the kind the model was exported for") from None
    out = np.asarray(out, dtype=np.float32)
    if out.ndim != 2:
        raise UsageError(f"model output has shape {out.shape}; predict expects (batch, classes)", model,
                         "use an image-classification model")
    if not np.isfinite(out).all():  # NaN/inf weights (or a diverged fine-tune): every score would be "nan"
        raise UsageError("the model's outputs are not finite (NaN/inf): its weights are broken", model,
                         "export or fine-tune the model again (check its training did not diverge)")
    return out


def _are_probabilities(scores: np.ndarray) -> bool:
    return bool(np.all(scores >= 0) and np.allclose(scores.sum(axis=1), 1.0, atol=1e-3))


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _name(classes: list[str] | None, index: int) -> str:
    return classes[index] if classes is not None and 0 <= index < len(classes) else str(index)


# --- the data ----------------------------------------------------------------------------------------------

def _resolve(data: str, pre: Preprocess, stdin) -> _Source:
    if data == STDIN:
        return _files(_stdin_paths(stdin), pre, "standard input")
    path = Path(data)
    if data.startswith("builtin:") or (path.is_file() and path.suffix.lower() == ".npz"):
        ds = load_data(data, pre, where="DATA")
        names = [f"{data}[{i}]" for i in range(len(ds))]
        return _Source(data, names, ds.batch, ds.labels, list(ds.class_names), list(ds.notes))
    if path.is_dir():
        subdirs = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
        direct = _images_in(path, recursive=False)
        if subdirs and not direct:
            return _folder(path, subdirs, pre)
        if not direct:
            raise UsageError("folder has no images", data, "give a folder of images, or one sub-folder of "
                             "images per class")
        return _files(direct, pre, data)
    if path.is_file():
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            raise UsageError("not an image, an image folder or an .npz", data,
                             f"give an image ({', '.join(sorted(IMAGE_SUFFIXES))}), a folder, an .npz, "
                             "or '-' to read image paths from standard input")
        return _files([path], pre, data)
    raise UsageError("data not found", data, "give an image folder, image files, an .npz, builtin:digits, "
                     "or '-' to read image paths from standard input")


def _stdin_paths(stdin) -> list[Path]:
    paths = []
    for k, text in enumerate(_lines(stdin)):
        if k >= MAX_PATH_LINES:
            raise UsageError(f"more than {MAX_PATH_LINES:,} lines on standard input", "DATA -",
                             "give one image path per line, at most that many in one run (split the list)")
        text = text.strip()
        if not text:
            continue
        p = Path(text)
        try:
            found = p.is_file()
        except (OSError, ValueError) as exc:  # a name over NAME_MAX, a NUL byte
            raise UsageError(f"not a usable path: {getattr(exc, 'strerror', None) or exc}", clip(repr(text)[1:-1], 200),
                             "give one existing image path per line") from None
        if not found:
            raise UsageError("image file not found", clip(text, 200), "give one existing image path per line")
        paths.append(p)
    return paths


def _lines(stdin):
    """The lines of ``stdin``, each read with a bound (a stream with no newline is refused at PATH_MAX, not
    held in memory); from its bytes when it has them, so a path that is not valid in the locale's encoding
    is still the file it names."""
    raw = getattr(stdin, "buffer", None)
    read = raw.readline if raw is not None else stdin.readline
    while True:
        line = read(MAX_PATH_LINE_BYTES + 1)
        if not line:
            return
        newline = b"\n" if isinstance(line, bytes) else "\n"
        if len(line) > MAX_PATH_LINE_BYTES and not line.endswith(newline):
            raise UsageError(f"a line of standard input is longer than {MAX_PATH_LINE_BYTES} bytes", "DATA -",
                             "give one image path per line")
        yield os.fsdecode(line) if isinstance(line, bytes) else line


def _images_in(folder: Path, recursive: bool) -> list[Path]:
    files = folder.rglob("*") if recursive else folder.iterdir()
    return sorted(f for f in files if f.is_file() and not f.name.startswith(".")
                  and f.suffix.lower() in IMAGE_SUFFIXES)


def _folder(root: Path, subdirs: list[Path], pre: Preprocess) -> _Source:
    files, labels = [], []
    for ci, d in enumerate(subdirs):
        found = _images_in(d, recursive=True)
        files.extend(found)
        labels.extend([ci] * len(found))
    notes = []
    empty = [d.name for ci, d in enumerate(subdirs) if ci not in set(labels)]
    if empty:
        notes.append(f"class folder(s) with no images: {', '.join(empty[:10])}")
    src = _files(files, pre, str(root))
    src.labels = np.asarray(labels, dtype=np.int64)
    src.class_names = [d.name for d in subdirs]
    src.notes = notes
    return src


def _files(paths: list[Path], pre: Preprocess, where: str) -> _Source:
    def batch(idx) -> np.ndarray:
        out = np.empty((len(idx), *pre.input_shape), dtype=np.float32)
        for k, i in enumerate(idx):
            to_model_input(read_image(paths[int(i)], pre), pre, out[k])
        return out

    return _Source(where, [str(p) for p in paths], batch, files=list(paths))


# --- labels and accuracy -----------------------------------------------------------------------------------

def _model_labels(src: _Source, classes: list[str] | None, num_out: int, notes: list[str]):
    """(each input's label in the model's numbering, -1 for a class the model does not have; each input's
    label as DATA names it). By class name when the model recorded names and DATA's share some, else by index."""
    data_names = src.class_names or [str(i) for i in range(int(src.labels.max(initial=0)) + 1)]
    truth_names = [data_names[int(i)] for i in src.labels]
    if classes is not None and any(c in classes for c in data_names):
        lookup = np.asarray([classes.index(c) if c in classes else -1 for c in data_names], dtype=np.int64)
        unknown = [c for c in data_names if c not in classes]
        if unknown:
            notes.append(f"DATA has class(es) the model does not know ({clip(', '.join(unknown), 80)}): their "
                         "inputs count as wrong")
        return lookup[src.labels], truth_names
    top = int(src.labels.max(initial=0))
    if num_out and top >= num_out:
        raise UsageError(f"label {top} is out of range for a model with {num_out} classes", src.text,
                         f"label the data with class indices 0..{num_out - 1} (or class names the model records)")
    if classes is not None and src.class_names and not all(n == str(i) for i, n in enumerate(src.class_names)):
        notes.append("DATA's class names are not the model's: labels matched by index")
        truth_names = [_name(classes, int(i)) for i in src.labels]
    return src.labels, truth_names


def _accuracy(labels: np.ndarray, confusion: dict, top1: int, topk: int, k: int, classes) -> PredictAccuracy:
    """``confusion`` counts (true name, true model index or -1, predicted index)."""
    n = int(len(labels))
    per_class = []
    for name, truth in sorted({(nm, t) for nm, t, _ in confusion}, key=lambda c: (c[1] < 0, c[1], c[0])):
        row = {p: c for (nm, t, p), c in confusion.items() if nm == name}
        total = sum(row.values())
        wrong = sorted(((c, p) for p, c in row.items() if p != truth), reverse=True)
        per_class.append(ClassRecall(name, truth if truth >= 0 else None, total, row.get(truth, 0),
                                     100.0 * row.get(truth, 0) / total,
                                     _name(classes, wrong[0][1]) if wrong else None, wrong[0][0] if wrong else 0))
    return PredictAccuracy(n, 100.0 * top1 / n, 100.0 * topk / n, k, per_class,
                           [Confusion(nm, _name(classes, p), c) for (nm, _t, p), c in sorted(confusion.items())])
