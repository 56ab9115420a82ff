"""The table a workload run prints (``sessionloop bench --workload``), and its live progress line."""

from __future__ import annotations

from sessionloop.cli.loadtest.engine import Progress
from sessionloop.cli.loadtest.results import Phase, Result


def phase_row(p: Phase) -> str:
    c, lat = p.counts, p.latency
    return (f"{p.name:<12}{p.end_s - p.start_s:>7.1f}{c.turns:>9,}{p.turns_per_s:>9.1f}{lat.p50_ms:>9.1f}"
            f"{lat.p95_ms:>9.1f}{lat.p99_ms:>9.1f}{lat.max_ms:>10.1f}{c.failed:>8,}{c.errors:>8,}")


def format_result(r: Result) -> str:
    o = r.overall
    spawned = " (spawned)" if r.target.spawned else ""
    lines = [f"sessionloop bench: workload {r.workload}, seed {r.seed}, against {r.target.url}{spawned}, "
             f"{r.duration_s:.1f} s",
             f"{'phase':<12}{'s':>7}{'turns':>9}{'turns/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
             f"{'max ms':>10}{'failed':>8}{'errors':>8}", "-" * 90]
    lines += [phase_row(p) for p in r.phases]
    lines += ["-" * 90, phase_row(o)]
    c = o.counts
    lines.append(f"sends {c.sent:,} (acknowledged {c.acknowledged:,}, duplicates {c.duplicates_sent:,} of which "
                 f"deduplicated {c.deduplicated:,}), quota refusals waited out {c.rejected:,}, "
                 f"approvals answered {c.approvals:,}")
    if o.first_delta.count:
        fd = o.first_delta
        lines.append(f"first streamed delta on watched sessions: p50 {fd.p50_ms:.1f} ms, p99 {fd.p99_ms:.1f} ms "
                     f"({fd.count:,} turns)")
    for e in r.errors[:10]:
        lines.append(f"error {e.kind}: {e.count:,} (first at {e.first_s:.1f} s: {e.example[:160]})")
    a = r.audit
    if a.ok:
        lines.append(f"audit (event feed): ok: {a.turns_found:,} acknowledged sends, each with exactly one turn; "
                     f"{a.deduplicated:,} of {a.duplicates_sent:,} duplicates deduplicated")
    else:
        lines.append(f"audit (event feed): FAILED: {a.missing:,} lost, {a.duplicated:,} duplicated, of "
                     f"{a.acknowledged:,} acknowledged sends")
        lines += [f"  {x}" for x in a.examples[:10]]
    return "\n".join(lines)


def progress_line(p: Progress) -> str:
    s = p.sample
    lat = "-" if s.p50_ms is None else f"{s.p50_ms:.0f}/{s.p99_ms:.0f} ms"
    return (f"{p.t_s:6.1f}/{p.seconds:.0f} s  {p.phase:<10} {s.turns_per_s:8.1f} turns/s  p50/p99 {lat:<14} "
            f"in flight {s.in_flight:>6,}  users/rate {s.users:>6,}  turns {p.turns:>9,}  "
            f"errors {p.errors:>6,}")


__all__ = ["format_result", "progress_line"]
