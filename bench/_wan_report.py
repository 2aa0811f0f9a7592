"""The figures of a bench.wan run as Markdown: the RTT cells and their ratios to 0 ms, the
keepalive check, the path-changed cell (bench/wan.py)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["closure_text", "path_report", "ratios", "report"]


def closure_text(figures: dict[str, Any]) -> str:
    parts = []
    for way in ("backup", "restore"):
        if f"{way}_mb_s" in figures:
            same = "" if figures.get(f"{way}_identical") else " (NOT identical)"
            parts.append(f"{way} {figures[f'{way}_mb_s']:.1f} MB/s{same}")
        elif f"{way}_error" in figures:
            parts.append(
                f"{way} FAILED after {figures[f'{way}_failed_after_s']:.0f} s:"
                f" {figures[f'{way}_error']}"
            )
    return ", ".join(parts)


def _rates(cell: dict[str, Any]) -> dict[str, float]:
    rates = {key: value for key, value in cell.items() if key.endswith("_mb_s")}
    closure = cell.get("closure", {})
    for way in ("backup", "restore"):
        if f"{way}_mb_s" in closure:
            rates[f"closure_{way}_mb_s"] = closure[f"{way}_mb_s"]
    return rates


def ratios(cells: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    base = _rates(cells.get("0", {}))
    return {
        rtt: {key: value / base[key] for key, value in _rates(cell).items() if base.get(key)}
        for rtt, cell in cells.items()
    }


def report(results: dict[str, Any]) -> str:
    """The figures as Markdown tables."""
    cells, ratios = results["cells"], results["ratios"]
    keys = sorted({key for cell in cells.values() for key in _rates(cell)})
    lines = (
        [
            "| RTT ms | " + " | ".join(key.removesuffix("_mb_s") for key in keys) + " |",
            "|---" * (len(keys) + 1) + "|",
        ]
        if cells
        else []
    )
    for rtt, cell in cells.items():
        rates = _rates(cell)
        row = [
            f"{rates[key]:.1f} ({ratios.get(rtt, {}).get(key, float('nan')):.2f}x)"
            if key in rates
            else "failed"
            for key in keys
        ]
        lines.append(f"| {rtt} | " + " | ".join(row) + " |")
    for rtt, cell in cells.items():
        closure = cell.get("closure")
        if closure and ("backup_error" in closure or "restore_error" in closure):
            lines.append(f"\nRTT {rtt} ms closure: {closure_text(closure)}")
    if "keepalive" in results:
        k = results["keepalive"]
        lines.append(
            f"\nkeepalive at RTT {k['rtt_ms']:g} ms over {k['seconds']:.0f} s: "
            f"{k['connections']} connection(s), {k['streams_broken']} stream(s) broken, "
            f"{k['sessions_lost']} session loss line(s); closure {closure_text(k['closure'])},"
            f" stage {k['stage_mb_s']:.1f} MB/s"
        )
    if "path" in results:
        lines += ["", *path_report(results["path"])]
    return "\n".join(lines)


def path_report(path: dict[str, Any]) -> list[str]:
    """The path-changed cell: each closure of both sessions, the grown one's ratio to the
    born one's."""
    rtt, after = f"{path['rtt_ms']:g} ms", f"{path['after_s']:g} s"
    by_second = ", ".join(f"{rate:.1f}" for rate in path["backup_mb_s_by_second"])
    lines = [
        "| session | closure | backup MB/s | restore MB/s |",
        "|---|---|---|---|",
    ]
    for index, (born, changed) in enumerate(zip(path["born"], path["changed"], strict=True)):
        cells: dict[str, list[str]] = {"born": [], "changed": []}
        for way in ("backup", "restore"):
            key = f"{way}_mb_s"
            cells["born"].append(f"{born[key]:.1f}" if key in born else "failed")
            if key in changed and key in born:
                cells["changed"].append(f"{changed[key]:.1f} ({changed[key] / born[key]:.2f}x)")
            else:
                cells["changed"].append(f"{changed[key]:.1f}" if key in changed else "failed")
        lines.append(f"| born at {rtt} | {index + 1} | " + " | ".join(cells["born"]) + " |")
        lines.append(
            f"| 0 ms, {rtt} after {after} | {index + 1} | " + " | ".join(cells["changed"]) + " |"
        )
    lines.append(f"\nthe first backup after the change, MB/s in each second: {by_second}")
    return lines
