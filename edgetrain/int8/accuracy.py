"""Top-1 accuracy of a model on a labelled Dataset, in batches (fp32 and int8 measured the same way)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..data import Dataset
from ..runners import OrtRunner

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


def onnx_top1(path, dataset: Dataset, threads: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> float:
    return top1(OrtRunner(path, threads).infer, dataset, progress=progress)
