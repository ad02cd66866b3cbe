"""Fine-tuning on the device: the job, its engines and what they keep on disk.

What other code may use is named here; the modules inside are the wing's own business.
"""
from .job import (DEFAULT_VAL_SPLIT, FinetuneJob, FinetuneResult, Interrupted, ShapeMismatch, check_shapes,
                  progress_events)
from .buildstore import BuildStore
from .featurecache import FeatureStore
from .onnx_layers import with_metadata_streamed
from .outdir import prepare_outdir

__all__ = ["BuildStore", "DEFAULT_VAL_SPLIT", "FeatureStore", "FinetuneJob", "FinetuneResult", "Interrupted", "ShapeMismatch",
           "check_shapes", "prepare_outdir", "progress_events", "with_metadata_streamed"]
