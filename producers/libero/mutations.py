"""Mutation operators for LIBERO scenarios, one family per axis LIBERO-PRO and LIBERO-Plus perturb
statically; pure functions of (scenario, parameters) that return a child scenario (parent_id set).

    layout(spec, dx_m=0.04, dy_m=0.0, yaw_rad=0.5)          # the target moved/turned from its init state
    material(spec, friction=0.3, mass_scale=3.0)             # slipperier, heavier target
    distractor(spec, "ketchup", x_m=0.1, y_m=-0.15)          # one more object of LIBERO's own set
    paraphrase(spec, 1)                                      # the instruction said another way
    camera(spec, dx_m=0.05, pitch_rad=0.1)                   # pixel policies only
    lighting(spec, diffuse_scale=0.4)                        # pixel policies only

``PROBE`` gives one mutation per axis at a moderate magnitude (what bench reports). Distractor
categories come from LIBERO's object set (``DISTRACTOR_CATEGORIES``: the grocery items of
libero_object and the tableware of the other suites); x/y of a distractor are in the task's
workspace frame (its BDDL regions' frame). Whether a mutated scenario is still solvable is the
feasibility pre-check's job (producers/libero/feasibility.py).
"""

from __future__ import annotations

import re

from schemas.libero_scenario import LiberoScenario

# LIBERO object categories (libero/libero/envs/objects) usable as distractors.
DISTRACTOR_CATEGORIES = ("alphabet_soup", "bbq_sauce", "butter", "chocolate_pudding", "cream_cheese", "ketchup",
                         "milk", "orange_juice", "salad_dressing", "tomato_sauce", "akita_black_bowl", "plate",
                         "wine_bottle", "cookies")


def layout(spec: LiberoScenario, dx_m: float = 0.0, dy_m: float = 0.0, yaw_rad: float = 0.0,
           subject: str = "target") -> LiberoScenario:
    values = {f"layout.{subject}.dx_m": dx_m, f"layout.{subject}.dy_m": dy_m, f"layout.{subject}.yaw_rad": yaw_rad}
    return spec.perturb(**{k: v for k, v in values.items() if v})


def material(spec: LiberoScenario, friction: float | None = None, mass_scale: float | None = None,
             tint: tuple[float, float, float] | None = None, subject: str = "target") -> LiberoScenario:
    values: dict[str, float] = {}
    if friction is not None:
        values[f"material.{subject}.friction"] = friction
    if mass_scale is not None:
        values[f"material.{subject}.mass_scale"] = mass_scale
    if tint is not None:
        values.update({f"material.{subject}.tint_{c}": v for c, v in zip("rgb", tint, strict=True)})
    return spec.perturb(**values)


def distractor(spec: LiberoScenario, category: str, x_m: float, y_m: float, yaw_rad: float = 0.0) -> LiberoScenario:
    if category not in DISTRACTOR_CATEGORIES:
        raise ValueError(f"distractor category must be one of {DISTRACTOR_CATEGORIES}, got {category!r}")
    values = {f"distractor.{category}.x_m": x_m, f"distractor.{category}.y_m": y_m}
    if yaw_rad:
        values[f"distractor.{category}.yaw_rad"] = yaw_rad
    return spec.perturb(**values)


def camera(spec: LiberoScenario, name: str = "agentview", **deltas: float) -> LiberoScenario:
    """deltas: dx_m, dy_m, dz_m, pitch_rad, yaw_rad."""
    return spec.perturb(**{f"camera.{name}.{k}": v for k, v in deltas.items()})


def lighting(spec: LiberoScenario, diffuse_scale: float | None = None, ambient: float | None = None,
             **shift: float) -> LiberoScenario:
    values: dict[str, float] = {f"light.all.{k}": v for k, v in shift.items()}
    if diffuse_scale is not None:
        values["light.all.diffuse_scale"] = diffuse_scale
    if ambient is not None:
        values["light.all.ambient"] = ambient
    return spec.perturb(**values)


# Paraphrase templates for LIBERO's "pick up the X and place it in/on the Y" and "put the X in/on the Y".
_PICK_PLACE = re.compile(r"^(?:pick up|pick) the (?P<obj>.+?) and (?:place|put) it "
                         r"(?P<rel>in|on|into|onto) the (?P<dst>.+)$")
_PUT = re.compile(r"^put the (?P<obj>.+?) (?P<rel>in|on|into|onto|on top of) the (?P<dst>.+)$")
PARAPHRASES = ("put the {obj} {rel} the {dst}",
               "grab the {obj} and drop it {rel} the {dst}",
               "move the {obj} {rel} the {dst}",
               "take the {obj} and set it {rel} the {dst}",
               "the {obj} goes {rel} the {dst}")


def paraphrases(instruction: str) -> list[str]:
    """Other wordings of a pick-and-place instruction (empty when it has another form)."""
    text = instruction.strip().lower()
    m = _PICK_PLACE.match(text) or _PUT.match(text)
    if not m:
        return []
    out = [t.format(**m.groupdict()) for t in PARAPHRASES]
    return [p for p in out if p != text]


def paraphrase(spec: LiberoScenario, index: int = 0) -> LiberoScenario:
    options = paraphrases(spec.instruction)
    if not options:
        raise ValueError(f"no paraphrase template fits {spec.instruction!r}")
    return spec.mutate(instruction=options[index % len(options)])


# One mutation per axis at a moderate magnitude: what `python -m producers.libero.bench` reports.
PROBE = {
    "layout": lambda s: layout(s, dx_m=0.05, dy_m=-0.03, yaw_rad=0.6),
    "material": lambda s: material(s, friction=0.4, mass_scale=3.0),
    "distractor": lambda s: distractor(s, "ketchup", x_m=0.0, y_m=0.0),
    "paraphrase": lambda s: paraphrase(s, 1),
    "camera": lambda s: camera(s, dx_m=0.06, dz_m=0.04, pitch_rad=0.08),
    "lighting": lambda s: lighting(s, diffuse_scale=0.35),
}
