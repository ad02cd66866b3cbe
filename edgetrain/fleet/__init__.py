"""Fine-tuning across many devices on Flower (``edgetrain fleet serve`` / ``edgetrain fleet join``).

Only the trainable part (the output layer) travels, as plain NumPy arrays; raw data never leaves a
device. Modules: ``codec`` (8-bit affine and 2-bit with error feedback), ``local`` (one device's
training round through edgetrain's fine-tuning engine), ``coordinator`` and ``client`` (the round logic),
``apps`` (Flower's ServerApp/ClientApp; the only module importing flwr), ``procs`` (Flower's processes;
``watchdog`` kills them when serve or join dies),
``report`` (the round-by-round report).
"""
