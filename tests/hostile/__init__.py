"""A reusable hostile-input suite (issue 12).

``gen`` generates hostile files (data, images, YAML, ONNX, model references); ``faults`` kills runs at
a phase, fills a disk (a tiny tmpfs, or a size-limited file where mounting is not allowed) and bounds a
child's memory. The test modules here assert the promise for the whole class of each input, not one
message: a one-line error and its exit code, nothing overwritten, nothing left behind.
"""
