"""The report from a real chDB store: report.md and a self-contained report.html that headless
Chromium renders without a console error, its heatmap visible in a screenshot."""

import re
import uuid

import numpy as np
import pytest
import read_world as world
from chromium import chromium_binary, render
from evidence_factory import store_events

from consumers import state as bs
from consumers.evidence.store import migrate
from consumers.report import write_report
from consumers.report_data import NothingToReport, gather, heatmap_colour
from producers.keyframes import KeyframeStore

needs_chromium = pytest.mark.skipif(chromium_binary() is None, reason="Debian package chromium not installed "
                                    "(.ci/run installs it)")


@pytest.fixture(scope="module")
def written(chdb_store, tmp_path_factory):
    """One report of the world for the module's tests (its own database in the session's chDB)."""
    tmp_path = tmp_path_factory.mktemp("report")
    store = chdb_store.with_database(f"test_report_{uuid.uuid4().hex[:10]}")
    migrate(store)
    frames = KeyframeStore(tmp_path / "keyframes")
    frame = np.zeros((64, 64, 3), dtype=np.uint8)
    frame[:, :, 0] = 200  # a red frame: easy to find in the page
    sha = frames.put(frame)
    store_events(store, world.measure(world.build(keyframe=sha)).events)
    files = write_report(store, tmp_path / "report", tmp_path / "keyframes", ranking=["strong", "medium", "weak"])
    yield files, sha
    store.command("DROP DATABASE IF EXISTS {database}")


def test_markdown_shows_scores_frontier_promotions_and_quality(written):
    files, sha = written
    text = files.markdown.read_text()
    # the heatmap pools every seed: 20 selection + 20 held-out per model on the child
    assert "| `scn-slip` | friction | active | 1.00 [0.91, 1.00] n=40 | 0.85 [0.71, 0.93] n=40 |" in text
    # the frontier on held-out seeds (Spearman vs the ranking), then in-sample: the selection seeds
    # that promoted the child spread the models wider than seeds that chose nothing
    held_out, in_sample = text.split("In-sample, on the selection seeds")
    assert "| v3 | 1 | strong | weak | 40% | 0 / 3 | 1.00 |" in held_out
    assert "| v3 | 1 | strong | weak | 60% | 1 / 3 | 1.00 |" in in_sample.split("Held-out, the latest version")[0]
    assert "| weak | 1 | 20 | 0.50 | [0.30, 0.70] |" in in_sample  # the latest version's table: held-out
    # 18, 14 and 10 of the same 20 held-out seeds: 4 discordant pairs each, p=0.125 before Holm
    assert "`strong` ~ `medium` (Holm p=0.25); `medium` ~ `weak` (Holm p=0.25).\n0 of 2 pairs separated." in text
    assert "#### `scn-slip` from `scn-base` (friction)" in text
    assert "| semantic | **no** |" in text  # a critic that did not run says so
    assert "| weak | 20 | 95% | 20% | -75 pp |" in text  # the paired effect against the parent
    assert "Retired `scn-base`: saturated." in text
    assert "![representative episode" in text and f"keyframes/{sha}.png" in text
    assert (files.markdown.parent / "keyframes" / f"{sha}.png").is_file()
    for name in ("heatmap", "frontier", "effects", "failures", "quality", "funnel"):
        assert f"figures/{name}.png" in text and (files.markdown.parent / "figures" / f"{name}.png").is_file()
    # execution quality beside success: trials, success, analysed, trials with a recovered moment,
    # successes that recovered, successes flagged (only by a moment never recovered from), moments (recovered)
    assert "| weak | 60 | 55% | 60 | 9 | 1 | 0 | 18 (9) |" in text
    assert "| scenario | what | status | oracle@1 | strong@1 |" in text  # each model at its latest version


def test_html_is_self_contained_and_small(written):
    files, sha = written
    html = files.html.read_text()
    assert files.html_bytes < 5 * 1024 * 1024
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html), "the report must not fetch anything"
    assert "<script" not in html
    assert "default-src 'none'" in html  # and the page forbids it, so a stray fetch is a console error
    assert html.count("data:image/png;base64,") >= 7  # 6 figures + the cluster's keyframe
    assert "scn-slip" in html and "slips off a light cube" in html
    cells = "".join(f'<td class="n">{v}</td>' for v in (60, "55%", 60, 9, 1, 0))
    assert f"<td>weak</td>{cells}" in html  # the quality table: recoveries beside success


@needs_chromium
def test_chromium_renders_the_report_without_errors_and_shows_the_heatmap(written):
    files, _ = written
    page = render(files.html.as_uri(), "#heatmap")
    assert page.errors == []
    assert page.screenshot is not None, "no #heatmap on the page"
    pixels = np.asarray(page.screenshot).reshape(-1, 3).astype(int)

    def share(rgb):
        return float(np.mean(np.all(np.abs(pixels - np.array(rgb)) <= 6, axis=1)))

    # oracle on scn-slip (100%), medium (50%) and weak (20%): each cell's colour is on the screen
    for rate in (1.0, 0.6, 0.35):  # oracle, medium and weak on the child, every seed pooled
        assert share(heatmap_colour(rate)) > 0.01, f"no cell coloured for {rate:.0%} in the heatmap"
    assert share((255, 255, 255)) < 0.9  # not a blank region


@needs_chromium
def test_the_render_check_fails_on_a_broken_page(tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><table id='heatmap'><tr><td>x</td></tr></table>"
                      "<img src='missing.png'><script>throw new Error('boom')</script></body></html>")
    page = render(broken.as_uri(), "#heatmap")
    assert any("boom" in e for e in page.errors)
    assert any("missing.png" in e or "ERR_FILE_NOT_FOUND" in e for e in page.errors)


def test_an_empty_log_has_nothing_to_report(store):
    with pytest.raises(NothingToReport, match="no ended episode"):
        gather(store)


def test_report_before_any_promotion_scores_every_scenario(store, tmp_path):
    from evidence_factory import EvidenceLog, spec

    log = EvidenceLog()
    for seed in range(4):
        log.episode("oracle", spec("lift"), seed, True)
        log.episode("novice", spec("lift"), seed, seed < 2)
    store_events(store, log.events)
    assert bs.benchmark_versions(store) == []
    files = write_report(store, tmp_path / "r", tmp_path / "keyframes")
    text = files.markdown.read_text()
    assert "Nothing has been promoted yet" in text and "| `scn-lift` | base | evaluated |" in text
    assert "| all | 1 |" in text  # the frontier over every scenario


def test_the_report_shows_each_model_at_its_latest_version(store):
    from evidence_factory import EvidenceLog, spec

    from consumers.report import render_markdown

    log = EvidenceLog()
    log.register("m", version="1")
    for seed in range(4):
        log.episode("m", spec("lift"), seed, False, model_version="1")
    log.register("m", version="2")
    for seed in range(4):
        log.episode("m", spec("lift"), seed, True, model_version="2", moments=[("slip", 3, 7)])
    log.register("m", version="3")  # registered, not run yet: the report stays on m@2 and says so
    store_events(store, log.events)
    data = gather(store)
    assert data.model_versions == {"m": "2"} and [q.model_version for q in data.quality] == ["2"]
    assert data.not_yet_run == {"m": "3"}
    text = render_markdown(data, {}, {})
    assert "| `scn-lift` | base | evaluated | 1.00 [0.51, 1.00] n=4 |" in text  # m@1's failures are not pooled in
    assert "| m | 4 | 100% | 4 | 4 | 4 | 0 | 4 (4) |" in text
    assert "`m@3` is registered but has no trials here yet: `m` is shown at `m@2`." in text
