"""The fleet's results: the coordinator's round-by-round report (JSON + an HTML section) and a device's."""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from ..results import Result


@dataclass
class FleetResult(Result):
    rundir: str
    model: str
    address: str
    tls: bool
    codec: str
    aggregate: str
    rounds_requested: int
    rounds_completed: int
    initial_accuracy: float | None
    final_accuracy: float | None
    bytes_up: int
    bytes_up_fp32: int
    bytes_down: int
    rounds: list[dict]
    resumed_after: int = 0
    report: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def uplink_reduction(self) -> float | None:
        return self.bytes_up_fp32 / self.bytes_up if self.bytes_up else None

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["uplink_reduction"] = self.uplink_reduction
        return d

    def checks(self) -> list[str]:
        if self.rounds_completed < self.rounds_requested:
            return [f"only {self.rounds_completed} of {self.rounds_requested} rounds completed"]
        stale = [r["round"] for r in self.rounds if not r.get("updated")]
        if stale and len(stale) == len(self.rounds):
            return ["no round received enough updates to change the global model (--min-updates)"]
        return []


@dataclass
class JoinResult(Result):
    name: str
    state: str
    address: str
    rounds_trained: int
    last_round: int
    final_accuracy: float | None
    notes: list[str] = field(default_factory=list)


def html_section(res: FleetResult) -> str:
    """The fleet's section of an HTML report: one row per round, one line per device."""
    e = html.escape
    rows = []
    for r in res.rounds:
        parts = "<br>".join(
            f"{e(str(p.get('client')))} ({e(str(p.get('device')))}): {p.get('seconds', 0):.1f}s, "
            f"peak {p.get('peak_rss_mb', 0):.0f} MB, {p.get('bytes_up', 0)} B up"
            + (f", {p['joules']:.2f} J {e(str(p.get('energy_provenance') or ''))}" if p.get("joules") else "")
            for p in r["participants"])
        trouble = "<br>".join(e(f"{k}: {x.get('client') or x.get('node_id')}: {str(x.get('reason', ''))[-160:]}")
                              for k in ("refused", "failed") for x in r.get(k, []))
        trouble += "<br>".join(e(f"no answer within the round timeout: node {n}") for n in r.get("missing", []))
        rows.append(f"<tr><td>{r['round']}</td><td>{r['accuracy']:.4f}</td><td>{r['updates']}</td>"
                    f"<td>{r['bytes_up']}</td><td>{r['bytes_down']}</td><td>{r['seconds']:.1f}</td>"
                    f"<td>{parts}</td><td>{trouble}</td></tr>")
    red = f"{res.uplink_reduction:.2f}x fewer than float32" if res.uplink_reduction else "n/a"
    return (f"<section id='fleet'><h2>Fleet: {e(res.model)}</h2>"
            f"<p>{res.rounds_completed} of {res.rounds_requested} rounds, {e(res.aggregate)}, codec {e(res.codec)} (uplink {red}); "
            f"held-out top-1 {res.initial_accuracy or 0:.4f} before, {res.final_accuracy or 0:.4f} after; "
            f"coordinator {e(res.address)}{' (TLS)' if res.tls else ' (no TLS)'}.</p>"
            "<table><tr><th>round</th><th>held-out top-1</th><th>updates</th><th>bytes up</th><th>bytes down</th>"
            "<th>seconds</th><th>devices (time, peak RSS, bytes, energy)</th><th>left out</th></tr>"
            + "".join(rows) + "</table></section>")


def html_page(res: FleetResult) -> str:
    style = "body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>edgetrain fleet</title><style>{style}</style>"
            f"</head><body>{html_section(res)}</body></html>\n")
