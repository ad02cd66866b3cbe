"""`edgetrain devices`: list the bundled profiles, show one, describe this host."""
from __future__ import annotations

import click

from ..devices import list_profiles, load_device, match_profile
from ..host import detect_host
from .common import json_option, say, write_json


@click.group("devices")
def devices():
    """Device profiles (devices/*.yaml) and this host.

    A profile gives a target's cores, RAM, default threads and memory budget, its int8 ISA features, and
    its idle/load power, each figure with its source.
    """


def _features(isa) -> str:
    names = [k for k, v in (isa.model_dump() if hasattr(isa, "model_dump") else isa).items() if v]
    return ",".join(names) or "-"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _watts(fig) -> str:
    mark = {"measured": "", "rated": " (rated)", "estimate": " (est.)"}[fig.kind]
    return f"{fig.value:g}{mark}"


@devices.command("list")
@json_option
def list_(json_path):
    """Table of the bundled device profiles."""
    profiles = list_profiles()
    rows = [[p.name, p.title, p.arch, str(p.cores), f"{p.ram_mb} MB", str(p.default_threads),
             _features(p.isa), f"{_watts(p.power.idle_w)} / {_watts(p.power.load_w)}"] for p in profiles]
    say(json_path, _table(rows, ["NAME", "TITLE", "ARCH", "CORES", "RAM", "THREADS", "INT8 ISA",
                                 "IDLE / LOAD W"]))
    say(json_path, "\n`edgetrain devices show NAME` gives every figure with its source.")
    write_json(json_path, {"profiles": [p.to_dict() for p in profiles]})


@devices.command("show")
@click.argument("name_or_path", metavar="NAME|PATH")
@json_option
def show(name_or_path, json_path):
    """Every field of one profile (bundled NAME or a YAML PATH), with sources."""
    p = load_device(name_or_path)
    out = [
        f"{p.name}: {p.title}",
        f"  arch             {p.arch}",
        f"  cpu              {p.cpu}",
        f"  cores            {p.cores}",
        f"  RAM              {p.ram_mb} MB",
        f"  default threads  {p.default_threads}",
        f"  memory budget    {p.memory_budget_mb} MB",
        f"  OS reserve       {p.os_reserve_mb} MB: {p.os_reserve_why}",
        f"  int8 ISA         {_features(p.isa)}",
    ]
    for label, fig in (("idle power", p.power.idle_w), ("load power", p.power.load_w)):
        out.append(f"  {label:<16} {fig.value:g} W ({fig.kind})")
        out.append(f"      source: {fig.source}")
    out.append(f"  speed            {p.speed.method}")
    if p.speed.reference is not None:
        r = p.speed.reference
        out.append(f"      reference: {r.model} {r.input}x{r.input}, {r.threads} thread(s), {r.runtime}: "
                   f"{r.latency_ms:g} ms")
        out.append(f"      source: {r.source}")
    if p.speed.note:
        out.append(f"      note: {p.speed.note}")
    if p.notes:
        out.append(f"  notes            {p.notes}")
    say(json_path, "\n".join(out))
    write_json(json_path, p.to_dict())


@devices.command("host")
@json_option
def host(json_path):
    """This machine: arch, cores, RAM, CPU, int8 features, and the bundled profile it matches."""
    h = detect_host()
    match = match_profile(h)
    h.matched_profile = match.name if match else None
    out = [
        f"arch             {h.arch}" + (f" (kernel: {h.kernel_arch})" if h.kernel_arch and h.kernel_arch != h.arch
                                        else ""),
        f"cpu              {h.cpu}",
        f"cores            {h.cores_usable} usable of {h.cores_logical}",
        f"RAM              {h.ram_mb} MB",
        f"int8 ISA         {_features({k: v for k, v in h.isa.items() if k != 'avx512f'})}"
        + (" (+avx512f)" if h.isa.get("avx512f") else ""),
        f"OS               {h.os}",
        f"python           {h.python}",
        f"emulated         {'yes: ' + '; '.join(h.emulation_evidence) if h.emulated else 'no'}",
        f"matches profile  {h.matched_profile or 'none (results here are estimates for other devices)'}",
    ]
    say(json_path, "\n".join(out))
    write_json(json_path, h)
