"""The report: what the evidence log says about the models and the benchmark, for people.

`gather` (consumers/report_data.py) asks the typed queries (consumers.state) for everything the
report shows, and nothing else: the report keeps no state and writes no SQL. `write_report` renders it twice from
the same data: report.md (figures as PNG files beside it) and report.html, self-contained (styles
inline, figures and keyframes as data URIs, a content security policy that forbids any fetch), so
it opens without a network.

Usage (through the CLI):
    sepa-eval report --output eval_memory/report
"""

from __future__ import annotations

import base64
import shutil
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined

from consumers.evidence.store import EvidenceStore
from consumers.report_data import ReportData, gather, heatmap_colour

# --- rendering -----------------------------------------------------------------------------------

def _hex(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _text_colour(rgb: tuple[int, int, int]) -> str:
    luminance = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]
    return "#000000" if luminance > 140 else "#ffffff"


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("consumers", "templates"), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["pct"] = lambda x: "-" if x is None else f"{100 * x:.0f}%"
    env.filters["rate"] = lambda x: "-" if x is None else f"{x:.2f}"
    env.filters["num"] = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"
    env.filters["p"] = lambda x: "-" if x is None else "<0.001" if x < 0.001 else f"{x:.3f}"
    env.filters["signed"] = lambda x: f"{100 * x:+.0f} pp"
    env.filters["ci"] = lambda iv: f"[{iv[0]:.2f}, {iv[1]:.2f}]"
    env.filters["pp_ci"] = lambda iv: f"[{100 * iv[0]:+.0f}, {100 * iv[1]:+.0f}] pp"
    env.filters["when"] = lambda t: t.strftime("%Y-%m-%d %H:%M:%S UTC") if t else "-"
    env.filters["bg"] = lambda s: _hex(heatmap_colour(s.success_rate))
    env.filters["fg"] = lambda s: _text_colour(heatmap_colour(s.success_rate))
    env.filters["short"] = lambda s, n=14: s if len(s) <= n else s[:n] + "…"
    env.filters["mdcell"] = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    return env


def _with_versions(env: Environment, data: ReportData) -> Environment:
    """``model|arm(version)``: the model id, with ``@version`` when that is not the version the
    report shows it at (or always, with ``arm(version, true)``)."""
    def arm(model_id: str, version: str | None, always: bool = False) -> str:
        if version is None or (not always and data.model_versions.get(model_id) == version):
            return model_id
        return f"{model_id}@{version}"

    env.filters["arm"] = arm
    return env


def render_markdown(data: ReportData, figures: dict[str, str], keyframes: dict[str, str]) -> str:
    """figures / keyframes: name or sha256 -> path relative to the markdown file."""
    template = _with_versions(_environment(), data).get_template("report.md.j2")
    return template.render(d=data, figures=figures, keyframes=keyframes, legend=_legend())


def render_html(data: ReportData, figures: dict[str, bytes], keyframes: dict[str, bytes]) -> str:
    """figures / keyframes: name or sha256 -> PNG bytes, embedded as data URIs."""
    env = _with_versions(_environment(), data)
    env.autoescape = True
    uri = {name: "data:image/png;base64," + base64.b64encode(png).decode() for name, png in figures.items()}
    frames = {sha: "data:image/png;base64," + base64.b64encode(png).decode() for sha, png in keyframes.items()}
    return env.get_template("report.html.j2").render(d=data, figures=uri, keyframes=frames, legend=_legend())


def _legend() -> list[tuple[str, str, str]]:
    return [(f"{int(100 * x)}%", _hex(heatmap_colour(x)), _text_colour(heatmap_colour(x)))
            for x in (0.0, 0.25, 0.5, 0.75, 1.0)]


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    html: Path
    figures: tuple[Path, ...]
    html_bytes: int


def write_report(store: EvidenceStore, output_dir: Path, keyframe_root: Path, *, run_id: str | None = None,
                 ranking: list[str] | None = None) -> ReportFiles:
    """report.md (+ figures/*.png, keyframes/*.png) and a self-contained report.html in output_dir."""
    from consumers.report_figures import render_figures  # matplotlib: imported only to draw

    data = gather(store, run_id=run_id, ranking=ranking)
    figures = render_figures(data)
    frames = _keyframes(data, keyframe_root)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "figures").mkdir(exist_ok=True)
    paths = []
    for name, png in figures.items():
        path = output_dir / "figures" / f"{name}.png"
        path.write_bytes(png)
        paths.append(path)
    if frames:
        (output_dir / "keyframes").mkdir(exist_ok=True)
        for sha in frames:
            shutil.copyfile(keyframe_root / sha[:2] / f"{sha}.png", output_dir / "keyframes" / f"{sha}.png")
    markdown = output_dir / "report.md"
    markdown.write_text(render_markdown(data, {n: f"figures/{n}.png" for n in figures},
                                        {s: f"keyframes/{s}.png" for s in frames}))
    html = output_dir / "report.html"
    text = render_html(data, figures, frames)
    html.write_text(text)
    return ReportFiles(markdown, html, tuple(paths), len(text.encode()))


def _keyframes(data: ReportData, root: Path) -> dict[str, bytes]:
    """The representative keyframes of the clusters shown (and of promotions' source clusters)
    that exist on disk (a prune may have removed them)."""
    shas = {c.representative_keyframe_sha256 for c in data.clusters}
    shas |= {p.cluster.representative_keyframe_sha256 for v in data.versions for p in v.promotions if p.cluster}
    out = {}
    for sha in sorted(s for s in shas if s):
        path = root / sha[:2] / f"{sha}.png"
        if path.is_file():
            out[sha] = path.read_bytes()
    return out
