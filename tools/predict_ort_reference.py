"""The minimal hand-written ONNX Runtime classifier `edgetrain predict` is measured against.

    python tools/predict_ort_reference.py MODEL.onnx IMAGE_FOLDER [THREADS] [BATCH] [TOP_K]

What a user writes without edgetrain, doing the same work as `edgetrain predict MODEL IMAGE_FOLDER
--threads THREADS --batch BATCH --top-k TOP_K`: onnxruntime + NumPy + Pillow; every pool capped to THREADS
(the BLAS variables before NumPy loads, ONNX Runtime's intra-op threads); the preprocessing read from the
model's metadata as edgetrain records it (input shape, channels, mean/std, class names); each image
decoded (a big JPEG at a reduced scale, as edgetrain and Pillow's thumbnail do), converted, resized
(bilinear) and normalised; run BATCH at a time; softmax; the top-k printed one
line per image in `edgetrain predict`'s table format, so tools/bench_predict.py can check that both gave
the same answers. Nothing else: no argument checking, no error messages, no accuracy, no timing.
"""
import os
import sys

THREADS = sys.argv[3] if len(sys.argv) > 3 else "1"
os.environ.update(OMP_NUM_THREADS=THREADS, OPENBLAS_NUM_THREADS=THREADS)  # before NumPy loads its BLAS

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image


def main(model, folder, threads="1", batch="16", top_k="5"):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    pre = json.loads(sess.get_modelmeta().custom_metadata_map["edgetrain.preprocess"])
    c, h, w = pre["input_shape"]
    mean, std = np.float32(pre["mean"]), np.float32(pre["std"])
    names = pre.get("class_names")
    files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    name = sess.get_inputs()[0].name
    print(f"input\ttop-{top_k} (score)")
    for start in range(0, len(files), int(batch)):
        chunk = files[start:start + int(batch)]
        x = np.empty((len(chunk), c, h, w), dtype=np.float32)
        for i, f in enumerate(chunk):
            with Image.open(f) as im:
                if im.format == "JPEG":  # decode a big JPEG at a reduced scale, no less than 2x the model's size
                    im.draft("L" if c == 1 else "RGB", (2 * w, 2 * h))
                im = im.convert("L" if c == 1 else "RGB").resize((w, h), Image.BILINEAR)
                x[i] = ((np.asarray(im, dtype=np.float32).reshape(h, w, c) / 255.0 - mean) / std).transpose(2, 0, 1)
        z = sess.run(None, {name: x})[0]
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        for f, row in zip(chunk, p):
            top = np.argsort(-row)[:int(top_k)]
            print(f"{f}\t" + "  ".join(f"{names[i] if names else i} {row[i]:.3f}" for i in top))


if __name__ == "__main__":
    main(*sys.argv[1:])
