"""The report's pictures, drawn with matplotlib (Agg, no display) into PNG bytes.

Each function takes the gathered ReportData and returns PNG bytes or None when there is nothing
to draw; `render_figures` returns the ones that exist, by name.
"""

from __future__ import annotations

import io
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from consumers.report import ReportData, heatmap_colour  # noqa: E402

DPI = 90
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def render_figures(data: ReportData) -> dict[str, bytes]:
    drawn = {"heatmap": heatmap(data), "frontier": frontier(data), "effects": effects(data),
             "failures": failures(data), "quality": quality(data), "funnel": funnel(data)}
    return {name: png for name, png in drawn.items() if png is not None}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def heatmap(data: ReportData) -> bytes | None:
    """Scenario x model success (the HTML draws the same as a coloured table)."""
    rows, models = data.heatmap, data.heatmap_models
    if not rows or not models:
        return None
    fig, ax = plt.subplots(figsize=(1.4 + 1.3 * len(models), 0.9 + 0.42 * len(rows)))
    for i, row in enumerate(rows):
        for j, cell in enumerate(row.cells):
            if cell is None or not cell.episodes:
                ax.add_patch(plt.Rectangle((j, i), 1, 1, color="#eeeeee"))
                ax.text(j + 0.5, i + 0.5, "-", ha="center", va="center", fontsize=8)
                continue
            rgb = heatmap_colour(cell.success_rate)
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=tuple(c / 255 for c in rgb)))
            lo, hi = cell.interval
            light = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2] > 140
            ax.text(j + 0.5, i + 0.5, f"{cell.success_rate:.2f}\n[{lo:.2f},{hi:.2f}]", ha="center", va="center",
                    fontsize=7, color="black" if light else "white")
    ax.set_xlim(0, len(models))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(models))], models, rotation=30, ha="right", fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [f"{r.scenario_id} ({r.label}, {r.status})" for r in rows],
                  fontsize=8)
    ax.set_title("success per scenario x model, 95% Wilson interval", fontsize=9)
    return _png(fig)


def frontier(data: ReportData) -> bytes | None:
    """Each model's success per benchmark version, and how far apart best and worst are."""
    points = [d for d in data.frontier if d.model_scores]
    if not points:
        return None
    labels = [f"v{d.version}" if d.version is not None else "all" for d in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    model_ids = sorted({m.model_id for d in points for m in d.model_scores})
    for k, model_id in enumerate(model_ids):
        xs, ys, lo, hi = [], [], [], []
        for x, d in enumerate(points):
            score = next((m for m in d.model_scores if m.model_id == model_id), None)
            if score is None:
                continue
            xs.append(x)
            ys.append(score.success_rate)
            lo.append(score.success_rate - score.interval[0])
            hi.append(score.interval[1] - score.success_rate)
        left.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=model_id, color=PALETTE[k % len(PALETTE)])
    left.set_xticks(range(len(points)), labels)
    left.set_ylim(-0.02, 1.02)
    left.set_ylabel("success (pooled over the version's scenarios)")
    left.set_title("capability frontier", fontsize=9)
    left.legend(fontsize=7, loc="lower left")
    right.bar(range(len(points)), [d.spread for d in points], color="#3b528b")
    right.set_xticks(range(len(points)), labels)
    right.set_ylim(0, 1)
    right.set_ylabel("spread: best - worst")
    title = "discrimination"
    rhos = [d.spearman for d in points]
    if any(r is not None for r in rhos):
        twin = right.twinx()
        twin.plot(range(len(points)), [r if r is not None else float("nan") for r in rhos], "D-", color="#d62728")
        twin.set_ylim(-1.05, 1.05)
        twin.set_ylabel("Spearman vs reference ranking", color="#d62728")
        title += " (bars: spread, red: Spearman)"
    right.set_title(title, fontsize=9)
    fig.tight_layout()
    return _png(fig)


def effects(data: ReportData) -> bytes | None:
    """Forest plot: each promoted scenario's paired effect against its parent, per model."""
    rows = [(p.decision.scenario_id, e) for v in data.versions for p in v.promotions for e in p.effects]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.32 * len(rows)))
    for i, (_, e) in enumerate(rows):
        lo, hi = e.effect.interval
        colour = "#d62728" if hi < 0 else "#2ca02c" if lo > 0 else "#7f7f7f"
        ax.plot([lo, hi], [i, i], color=colour)
        ax.plot([e.effect.difference], [i], "o", color=colour)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [f"{s} | {e.model_id} (n={e.effect.pairs})" for s, e in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(-1.05, 1.05)
    ax.set_xlabel("promoted - parent success, same seeds (95% Newcombe interval)")
    ax.set_title("what each promotion did to each model (red: significantly harder)", fontsize=9)
    return _png(fig)


def failures(data: ReportData) -> bytes | None:
    """Failure moments per type over time (stacked)."""
    if not data.timeline:
        return None
    starts = sorted({b.start for b in data.timeline})
    types = sorted({b.failure_type for b in data.timeline})
    counts = defaultdict(int)
    for b in data.timeline:
        counts[(b.start, b.failure_type)] = b.moments
    fig, ax = plt.subplots(figsize=(8, 3.2))
    bottom = [0] * len(starts)
    for k, failure_type in enumerate(types):
        heights = [counts[(s, failure_type)] for s in starts]
        ax.bar(range(len(starts)), heights, bottom=bottom, label=failure_type, color=PALETTE[k % len(PALETTE)])
        bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
    step = max(1, len(starts) // 8)
    ax.set_xticks(range(0, len(starts), step), [starts[i].strftime("%m-%d %H:%M:%S") for i in
                                                 range(0, len(starts), step)], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("failure moments")
    ax.set_title("failures by type over time", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


def quality(data: ReportData) -> bytes | None:
    """Execution quality beside success, per model."""
    rows = [q for q in data.quality if q.scenario_id is None]
    if not rows:
        return None
    panels = (("success rate", lambda q: q.success_rate),
              ("jerk, m²/s⁶ (lower: smoother)", lambda q: q.smoothness_jerk),
              ("peak contact force, N", lambda q: q.peak_contact_force),
              ("re-grasps / episode", lambda q: q.regrasps),
              ("moments recovered", lambda q: q.recovery_rate or 0.0))
    fig, axes = plt.subplots(1, len(panels), figsize=(2.4 * len(panels), 2.8))
    names = [q.model_id for q in rows]
    for ax, (title, value) in zip(axes, panels, strict=True):
        ax.barh(range(len(rows)), [value(q) for q in rows], color=[PALETTE[i % len(PALETTE)] for i in range(len(rows))])
        ax.set_yticks(range(len(rows)), names if ax is axes[0] else [""] * len(rows), fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle("how the models executed, beside whether they succeeded", fontsize=9)
    fig.tight_layout()
    return _png(fig)


def funnel(data: ReportData) -> bytes | None:
    """The candidate funnel per generator: proposed -> judged -> decided."""
    rows = [f for f in data.funnel if f.generator not in ("all", "base") and (f.proposed or f.infeasible)]
    if not rows:
        return None
    stages = (("infeasible", lambda f: f.infeasible), ("proposed", lambda f: f.proposed),
              ("with verdicts", lambda f: f.with_verdicts), ("promoted", lambda f: f.promoted + f.retired),
              ("review", lambda f: f.review + f.approved), ("deferred", lambda f: f.deferred),
              ("rejected", lambda f: f.rejected), ("pending", lambda f: f.pending))
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.5 * len(stages)))
    height = 0.8 / len(rows)
    for k, f in enumerate(rows):
        ys = [i + k * height for i in range(len(stages))]
        ax.barh(ys, [value(f) for _, value in stages], height=height, label=f.generator,
                color=PALETTE[k % len(PALETTE)])
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(stages))], [s for s, _ in stages], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("candidates")
    ax.set_title("candidate funnel", fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)
