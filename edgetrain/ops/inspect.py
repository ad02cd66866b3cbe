"""What a MODEL reference (and optionally a DATA reference) resolves to: the check before real work."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..data import load_data
from ..errors import UsageError
from ..models import load_gluon
from ..preprocess import Preprocess
from ..results import Figure, Result


@dataclass
class InspectResult(Result):
    model: str
    kind: str
    input_shape: list[int]
    input_name: str
    num_classes: int
    parameters: int
    random_weights: bool
    preprocess: Preprocess
    notes: list[str] = field(default_factory=list)
    data: DataSummary | None = None


@dataclass
class DataSummary(Figure):
    """What ``--data`` resolved to, read with the model's preprocessing."""

    source: str
    samples: int
    classes: list[str]
    per_class: dict[str, int]     # samples of each class
    skipped_files: int
    sample_shape: list[int]
    sample_mean: float
    sample_std: float
    notes: list[str]


def inspect(model_ref: str, data_ref: str | None = None, params: str | None = None,
            input_shape: tuple[int, int, int] | None = None, mean=None, std=None) -> InspectResult:
    model = load_gluon(model_ref, params=params, input_shape=input_shape, mean=mean, std=std)
    n_params = sum(int(p.data().size) for p in model.block.collect_params().values())
    result = InspectResult(model_ref, model.ref.kind, [1, *model.preprocess.input_shape], model.preprocess.input_name,
                           model.num_classes, n_params, model.random_weights, model.preprocess,
                           list(model.notes))
    if data_ref:
        ds = load_data(data_ref, model.preprocess)
        if ds.num_classes > model.num_classes:
            raise UsageError(f"data has {ds.num_classes} classes but the model has {model.num_classes} outputs",
                             data_ref, "fine-tune the model on this data first (edgetrain finetune)")
        sample = ds.batch([0])
        counts = {name: int((ds.labels == i).sum()) for i, name in enumerate(ds.class_names)}
        result.data = DataSummary(data_ref, len(ds), ds.class_names, counts, ds.skipped, list(sample.shape),
                                  float(sample.mean()), float(sample.std()), ds.notes)
    return result
