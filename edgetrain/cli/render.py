"""Progress on the terminal: one renderer for every command's ``Progress`` events."""
from __future__ import annotations

import sys
import time

from ..results import Progress

# How a metric a command reports is shown, in this order.
METRICS = (("epoch", "epoch {}"), ("step", "step {}"), ("loss", "loss {:.4f}"), ("train_accuracy", "acc {:.3f}"),
           ("acc", "acc {:.3f}"), ("val_accuracy", "val acc {:.3f}"), ("samples_per_s", "{:.0f} samples/s"),
           ("seconds", "{:.1f}s"), ("rss_mb", "RSS {:.0f} MB"), ("budget_mb", "of {:.0f}"), ("eta_s", "ETA {:.0f}s"))


class ProgressLine:
    """Rewrites one status line on a terminal's stderr; when stderr is not a terminal, prints only the
    lines that stay (final events and messages). Disabled (``--json -``): prints nothing."""

    def __init__(self, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.live = enabled and self.stream.isatty()
        self.width = 0
        self.started: dict[str, tuple[float, int]] = {}  # a stage's first event: when, and how much was done

    def __call__(self, ev: Progress) -> None:
        if not self.enabled:
            return
        if ev.message and ev.done is None and not ev.final:  # a step of the work: on a terminal only
            if self.live:
                self._line(f"... {ev.message}", final=True)
            return
        if not (self.live or ev.final):
            return
        self._line(self.text(ev), final=ev.final or (ev.total is not None and ev.done == ev.total))

    def text(self, ev: Progress) -> str:
        parts = [] if ev.stage in ev.metrics else [ev.stage]
        if ev.total and ev.stage not in ev.metrics:  # an epoch's line says "epoch 2" itself: no bar
            now = time.monotonic()
            t0, done0 = self.started.setdefault(ev.stage, (now, ev.done or 0))
            fill = int(30 * (ev.done or 0) / ev.total)
            parts.append(f"[{'#' * fill}{'.' * (30 - fill)}] {ev.done}/{ev.total}")
            # the rate since the stage's first event: what came before it (a fleet's round 1, a resumed run's
            # epochs) took a time nobody saw, so the first event has no ETA ("ETA 0s" after round 1 of 10)
            if "eta_s" not in ev.metrics and ev.done and ev.done > done0:
                ev.metrics["eta_s"] = (now - t0) / (ev.done - done0) * (ev.total - ev.done)
        for key, fmt in METRICS:
            value = ev.metrics.get(key)
            if value is not None:
                parts.append(fmt.format(value))
        return "  ".join(parts) + (f"  {ev.message}" if ev.message else "")

    def _line(self, text: str, final: bool = False) -> None:
        from .streams import write_stream

        if self.live:
            line = "\r" + text.ljust(self.width) + ("\n" if final else "")
            self.width = 0 if final else len(text)
        else:
            line = text + "\n"
        write_stream(self.stream, line)
