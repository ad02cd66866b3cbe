"""Top-1 accuracy of a model on a labelled Dataset, in batches (fp32 and int8 measured the same way)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .data import Dataset

BATCH = 64


def top1(predict: Callable[[np.ndarray], np.ndarray], dataset: Dataset, batch: int = BATCH,
         progress: Callable[[int, int], None] | None = None) -> float:
    """Percentage of samples whose highest-scoring output is the label; ``progress(done, total)`` per batch."""
    if len(dataset) == 0:
        return float("nan")
    correct = 0
    for start in range(0, len(dataset), batch):
        idx = np.arange(start, min(start + batch, len(dataset)))
        scores = predict(dataset.batch(idx))
        correct += int((scores.argmax(axis=1) == dataset.labels[idx]).sum())
        if progress is not None:
            progress(int(idx[-1]) + 1, len(dataset))
    return 100.0 * correct / len(dataset)


def onnx_predictor(path, threads: int | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """Run an ONNX file in an ONNX Runtime session capped at ``threads``; returns the first output."""
    from .runtime import ort_session

    session = ort_session(path, threads)
    inp = session.get_inputs()[0]
    fixed = inp.shape[0] if isinstance(inp.shape[0], int) and inp.shape[0] > 0 else None

    def predict(x: np.ndarray) -> np.ndarray:
        if fixed is None or len(x) == fixed:
            return session.run(None, {inp.name: x})[0]
        # a model exported with a fixed batch size: run it that many samples at a time
        return np.concatenate([session.run(None, {inp.name: x[i:i + fixed]})[0] for i in range(0, len(x), fixed)])

    return predict


def onnx_top1(path, dataset: Dataset, threads: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> float:
    return top1(onnx_predictor(path, threads), dataset, progress=progress)
