"""The text bench/staging.py prints: its figures as markdown lines for docs/benchmarks.md."""

from __future__ import annotations

from typing import Any

__all__ = ["report"]

MiB = 2**20


def report(results: dict[str, Any], command: str, elapsed: float) -> list[str]:
    """The figures as markdown lines (what docs/benchmarks.md quotes)."""
    facts = results["machine"]
    lines = [
        f"command: `{command}`",
        "",
        f"machine: nproc {facts['nproc']}, {facts['cpu']}, Linux {facts['kernel']}, "
        f"Python {facts['python']}; wall time {elapsed:.0f} s",
        "",
        "1. Staging throughput, one object (MB/s = 10^6 B/s, first chunk -> reply, median of "
        "runs; CPU s/GiB of each process over the same span)",
        "",
        "| form | path | MB/s | runs | agent/baseline | child CPU | Corestore CPU | Cloudly CPU |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for form, rows in results["throughput"].items():
        agent = [r for r in rows if r["path"] == "agent" and not r["warmup"]]
        base = [r for r in rows if r["path"] == "baseline" and not r["warmup"]]
        ratio = _median(agent, "mb_per_s") / _median(base, "mb_per_s")
        for name, group in (("agent", agent), ("baseline", base)):
            runs = ", ".join(f"{r['mb_per_s']:.1f}" for r in group)
            lines.append(
                f"| {form} | {name} | {_median(group, 'mb_per_s'):.1f} | {runs} | "
                + (f"**{ratio:.2f}**" if name == "agent" else "")
                + f" | {_median(group, 'cpu_child_s_per_gib'):.2f}"
                f" | {_median(group, 'cpu_corestore_s_per_gib'):.2f}"
                f" | {_median(group, 'cpu_cloudly_s_per_gib'):.2f} |"
            )
        commits = ", ".join(f"{r['commit_s']:.2f}" for r in base)
        lines.append(
            f"| {form} | baseline without commit | {_median(base, 'forward_mb_per_s'):.1f} | "
            f"commit s: {commits} | | | | |"
        )
    rss = results["rss"]
    lines += [
        "",
        f"2. Agent process RSS staging {rss['bytes'] // MiB} MiB ({rss['form']} form, "
        f"{rss['mb_per_s']:.1f} MB/s): idle (connected and prepared) "
        f"{rss['idle_rss_kib'] / 1024:.1f} MiB (connected only "
        f"{rss['connected_rss_kib'] / 1024:.1f} MiB), peak "
        f"{rss['peak_kib'] / 1024:.1f} MiB, **{rss['above_idle_kib'] / 1024:.1f} MiB above idle** "
        f"(VmHWM reset before the stage: {rss['hwm_reset']}; VmHWM after "
        f"{rss['hwm_after_kib'] / 1024:.1f} MiB; {rss['samples']} VmRSS samples, max "
        f"{rss['sampled_peak_kib'] / 1024:.1f} MiB)",
    ]
    lines += ["", "3. Status round-trips while a stage runs on the same session", ""]
    lines += [
        "| stage | stage MB/s | count | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for status in results["status"]:
        lines.append(
            f"| {status['bytes'] // MiB} MiB, {status['form']} | {status['mb_per_s']:.1f} | "
            f"{status.get('count', 0)} | {status.get('p50_ms', 0):.1f} | "
            f"**{status.get('p99_ms', 0):.1f}** | {status.get('max_ms', 0):.1f} |"
        )
    cas = results["cas"]
    lines += [
        "",
        f"4. Durable CAS mutations: **{cas['sequential_per_s']:.0f}/s** sequential (one key), "
        f"{cas['concurrent_8_keys_per_s']:.0f}/s concurrent (8 keys, one db)",
    ]
    return lines


def _median(rows: list[dict[str, Any]], key: str) -> float:
    values = sorted(r[key] for r in rows)
    if not values:
        return float("nan")
    middle = len(values) // 2
    return float(values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2)
