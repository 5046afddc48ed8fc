"""LIBERO task BDDL text edits: a task's BDDL with distractor objects added, each parked in a
region of its own (reset() then moves it to its scenario position). Plain text work, apart from
producers/libero/env.py so it needs neither MuJoCo nor LIBERO (LiberoEnv writes the edited BDDL
before LIBERO parses it).
"""

from __future__ import annotations

from schemas.exceptions import LiberoScenarioError

# Distractor instances are named <category>_<n> (LIBERO's naming; its parser needs the suffix),
# numbered from here so they never clash with a task's own instances.
DISTRACTOR_INDEX_BASE = 91
DISTRACTOR_PARK_XY = (0.42, -0.42)
DISTRACTOR_PARK_STEP_M = 0.14


def _section_span(text: str, head: str) -> tuple[int, int]:
    """[start, end) of the parenthesised BDDL section that opens with ``head`` (e.g. "(:objects")."""
    start = text.find(head)
    if start < 0:
        raise LiberoScenarioError(f"the task's BDDL has no {head} section")
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return start, i + 1
    raise LiberoScenarioError(f"the task's BDDL {head} section is not closed")


def park_xy(index: int) -> tuple[float, float]:
    """Where distractor ``index`` is placed when the scene is sampled (workspace frame, m): a corner
    no task region uses, so LIBERO's rejection sampler always finds room; reset() then moves it to
    its scenario position (the stored init states fix every other object anyway)."""
    return DISTRACTOR_PARK_XY[0], DISTRACTOR_PARK_XY[1] + DISTRACTOR_PARK_STEP_M * index


def distractor_bddl(text: str, objects: dict[str, str], categories: list[str]) -> str:
    """The task's BDDL with one movable object per category added, each resting in a 2 mm region
    at its park_xy() of the task's workspace (the target of its first region). ``objects`` is the
    task's instance -> category map; the objects section is rewritten one line per category
    (LIBERO's parser keeps only the last line of a category)."""
    import re

    target = re.search(r"\(:target\s+([A-Za-z0-9_]+)\)", text)
    if target is None:
        raise LiberoScenarioError("the task's BDDL has no region to place distractors relative to")
    workspace = target.group(1)
    regions, inits = [], []
    by_category: dict[str, list[str]] = {}
    for name, category in objects.items():
        by_category.setdefault(category, []).append(name)
    for i, category in enumerate(categories):
        x, y = park_xy(i)
        region = f"sepa_distractor_{i}_region"
        regions.append(f"      ({region}\n          (:target {workspace})\n          (:ranges (\n"
                       f"              ({x - 0.001!r} {y - 0.001!r} {x + 0.001!r} {y + 0.001!r})\n"
                       f"            )\n          )\n      )\n")
        by_category.setdefault(category, []).append(distractor_name(category, i))
        inits.append(f"    (On {distractor_name(category, i)} {workspace}_{region})\n")
    start, end = _section_span(text, "(:objects")
    lines = "".join(f"    {' '.join(names)} - {category}\n" for category, names in by_category.items())
    text = text[:start] + "(:objects\n" + lines + "  )" + text[end:]

    def insert_after(section: str, body: str, src: str) -> str:
        at = src.find(section)
        if at < 0:
            raise LiberoScenarioError(f"the task's BDDL has no {section} section")
        line_end = src.find("\n", at) + 1
        return src[:line_end] + body + src[line_end:]

    text = insert_after("(:regions", "".join(regions), text)
    return insert_after("(:init", "".join(inits), text)


def distractor_name(category: str, index: int) -> str:
    return f"{category}_{DISTRACTOR_INDEX_BASE + index}"
