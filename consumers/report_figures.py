"""The report's pictures, drawn with matplotlib (Agg, no display) into PNG bytes.

Each function takes the gathered ReportData and returns PNG bytes or None when there is nothing
to draw; `render_figures` returns the ones that exist, by name.

What costs time here is text (each glyph is rasterised) and artists: grids are drawn as one image
(`imshow`), not one patch per cell, and the figures that grow with the benchmark (the heatmap, the
promotions' effects) are capped at a number of rows; the tables beside them list every row.
"""

from __future__ import annotations

import io
from collections import defaultdict

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import ListedColormap, Normalize
from matplotlib.figure import Figure

from consumers.report_data import ReportData, heatmap_colour

DPI = 90
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
# Rows drawn in the heatmap picture (report.md's; report.html draws the whole table in HTML): active
# scenarios come first, so the current benchmark is always in it. The markdown table lists every row.
HEATMAP_FIGURE_MAX_ROWS = 40
# Up to this many cells the heatmap picture writes each rate in its cell; past it, colour only.
HEATMAP_FIGURE_TEXT_CELLS = 120
# Promoted scenarios drawn in the effects picture (the most recent); the tables list every one.
EFFECTS_FIGURE_MAX_ROWS = 30
EMPTY_CELL = (238, 238, 238)


def render_figures(data: ReportData) -> dict[str, bytes]:
    drawn = {"heatmap": heatmap(data), "frontier": frontier(data), "effects": effects(data),
             "failures": failures(data), "quality": quality(data), "funnel": funnel(data)}
    return {name: png for name, png in drawn.items() if png is not None}


def _subplots(*args, figsize: tuple[float, float], **kwargs):
    """A figure outside pyplot (no figure manager, no redraw hook on every artist change, nothing to
    close) and its axes; savefig renders it with Agg."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*args, **kwargs)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def heatmap(data: ReportData) -> bytes | None:
    """Scenario x model success; the rate in each cell while they are few (text is what costs), the
    colour scale beside it (the intervals are in the table)."""
    rows, models = data.heatmap[:HEATMAP_FIGURE_MAX_ROWS], data.heatmap_models
    if not rows or not models:
        return None
    image = np.array([[heatmap_colour(c.success_rate) if c and c.episodes else EMPTY_CELL for c in row.cells]
                      for row in rows], dtype=np.uint8)
    fig, ax = _subplots(figsize=(2.4 + 0.9 * len(models), 0.9 + 0.26 * len(rows)))
    ax.imshow(image, aspect="auto", interpolation="nearest")
    if len(rows) * len(models) <= HEATMAP_FIGURE_TEXT_CELLS:
        for i, row in enumerate(rows):
            for j, cell in enumerate(row.cells):
                if cell is None or not cell.episodes:
                    ax.text(j, i, "-", ha="center", va="center", fontsize=7, color="#777777")
                    continue
                rgb = heatmap_colour(cell.success_rate)
                light = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2] > 140
                ax.text(j, i, f"{cell.success_rate:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if light else "white")
    scale = fig.colorbar(ScalarMappable(Normalize(0, 1), ListedColormap(
        [tuple(c / 255 for c in heatmap_colour(x / 255)) for x in range(256)])), ax=ax, fraction=0.05, pad=0.02)
    scale.ax.tick_params(labelsize=7)
    versions = data.model_versions
    ax.set_xticks(range(len(models)), [f"{m}@{versions[m]}" if versions.get(m) else m for m in models],
                  rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{r.scenario_id} ({r.label}, {r.status})" for r in rows], fontsize=7)
    shown = "" if len(rows) == len(data.heatmap) else f"; the first {len(rows)} of {len(data.heatmap)} scenarios"
    ax.set_title(f"success per scenario x model (95% intervals in the table{shown})", fontsize=9)
    return _png(fig)


def frontier(data: ReportData) -> bytes | None:
    """Each model's success per benchmark version, and how far apart best and worst are."""
    points = [d for d in data.frontier if d.model_scores]
    if not points:
        return None
    labels = [f"v{d.version}" if d.version is not None else "all" for d in points]
    fig, (left, right) = _subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    model_ids = sorted({m.model_id for d in points for m in d.model_scores})
    for k, model_id in enumerate(model_ids):
        xs, ys, lo, hi = [], [], [], []
        for x, d in enumerate(points):
            score = next((m for m in d.model_scores if m.model_id == model_id), None)
            if score is None:
                continue
            xs.append(x)
            ys.append(score.success_rate)
            # max(0, ...): at 0% or 100% the Wilson bound equals the rate up to rounding
            lo.append(max(0.0, score.success_rate - score.interval[0]))
            hi.append(max(0.0, score.interval[1] - score.success_rate))
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
    """Each promoted scenario's paired effect against its parent, per model: one row per promotion,
    one column per model, coloured by the difference; ringed where its 95% interval excludes 0."""
    promotions = [p for v in data.versions for p in v.promotions if p.effects]
    if not promotions:
        return None
    promotions = promotions[-EFFECTS_FIGURE_MAX_ROWS:]
    columns = sorted({_arm(e, data) for p in promotions for e in p.effects})
    grid = np.full((len(promotions), len(columns)), np.nan)
    marks = []
    for i, p in enumerate(promotions):
        for e in p.effects:
            j = columns.index(_arm(e, data))
            grid[i, j] = e.effect.difference
            lo, hi = e.effect.interval
            if hi < 0 or lo > 0:
                marks.append((j, i))
    fig, ax = _subplots(figsize=(max(6.5, 2.8 + 0.9 * len(columns)), 1.3 + 0.28 * len(promotions)))
    shown = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest", cmap="PuOr",
                      vmin=-1, vmax=1)
    ax.set_facecolor("#eeeeee")
    for i in range(len(promotions)):
        for j in range(len(columns)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{100 * grid[i, j]:+.0f}", ha="center", va="center", fontsize=7,
                        color="white" if abs(grid[i, j]) > 0.6 else "black")
    if marks:
        ax.scatter([m[0] for m in marks], [m[1] for m in marks], s=260, facecolors="none", edgecolors="black",
                   linewidths=1.2)
    ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(promotions)), [f"{p.decision.scenario_id} ({p.decision.factor})" for p in promotions],
                  fontsize=7)
    scale = fig.colorbar(shown, ax=ax, fraction=0.04, pad=0.02)
    scale.set_label("promoted - parent", fontsize=8)
    scale.ax.tick_params(labelsize=7)
    total = sum(1 for v in data.versions for p in v.promotions if p.effects)
    tail = "" if total == len(promotions) else f", the latest {len(promotions)} of {total}"
    ax.set_title(f"what each promotion did to each model{tail}: promoted - parent success in pp on the same\n"
                 "seeds, ringed where the 95% interval excludes 0", fontsize=9)
    return _png(fig)


def _arm(effect, data: ReportData) -> str:
    """A model as the effects figure labels it: with its version when that is not the one shown elsewhere."""
    shown = data.model_versions.get(effect.model_id)
    return effect.model_id if effect.model_version in (None, shown) else f"{effect.model_id}@{effect.model_version}"


def failures(data: ReportData) -> bytes | None:
    """Failure moments per type over time (stacked)."""
    if not data.timeline:
        return None
    starts = sorted({b.start for b in data.timeline})
    types = sorted({b.failure_type for b in data.timeline})
    counts = defaultdict(int)
    for b in data.timeline:
        counts[(b.start, b.failure_type)] = b.moments
    fig, ax = _subplots(figsize=(8, 3.2))
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
    """Execution quality beside success, per model: how clean the successes were (no failure moment,
    recovered from every moment, flagged by an unrecovered one), recoveries, re-grasps, force, jerk."""
    rows = [q for q in data.quality if q.scenario_id is None]
    if not rows:
        return None
    fig, axes = _subplots(1, 5, figsize=(13, 1.4 + 0.3 * max(4, len(rows))))
    names = [q.model_id for q in rows]
    ys = range(len(rows))
    left = axes[0]
    parts = (("no failure moment", lambda q: q.clean_successes, "#21918c"),
             ("recovered from every moment", lambda q: q.recovered_only_successes, "#5ec962"),
             ("flagged: a moment never recovered", lambda q: q.flagged_successes, "#fde725"))
    start = [0.0] * len(rows)
    for label, count, colour in parts:
        widths = [count(q) / q.episodes if q.episodes else 0.0 for q in rows]
        left.barh(ys, widths, left=start, color=colour, label=label, edgecolor="white", linewidth=0.5)
        start = [a + b for a, b in zip(start, widths, strict=True)]
    left.set_xlim(0, 1)
    left.set_title("success, and how clean", fontsize=8)
    fig.legend(*left.get_legend_handles_labels(), fontsize=7, loc="lower left", ncol=3, frameon=False,
               bbox_to_anchor=(0.0, -0.08))
    panels = (("trials with a recovered moment", lambda q: q.recovered_share),
              ("re-grasps / episode", lambda q: q.regrasps),
              ("peak contact force, N", lambda q: q.peak_contact_force),
              ("jerk, m²/s⁶ (lower: smoother)", lambda q: q.smoothness_jerk))
    for k, (ax, (title, value)) in enumerate(zip(axes[1:], panels, strict=True)):
        ax.barh(ys, [value(q) for q in rows], color=PALETTE[k % len(PALETTE)])
        ax.set_title(title, fontsize=8)
    axes[1].set_xlim(0, 1)
    for ax in axes:
        ax.set_yticks(ys, names if ax is axes[0] else [""] * len(rows), fontsize=7)
        ax.invert_yaxis()
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
    fig, ax = _subplots(figsize=(7, 0.8 + 0.5 * len(stages)))
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
