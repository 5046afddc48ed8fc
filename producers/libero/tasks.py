"""LIBERO's suites and tasks, read from the files of an installed LIBERO without importing it.

    tasks = TaskCatalog(package_dir)                 # <site-packages>/libero/libero
    tasks.suites()                                   # {"libero_object": [task names], ...}
    info = tasks.info("libero_object", "pick_up_the_ketchup_and_place_it_in_the_basket")
    info.instruction, info.target, info.goal         # "pick up the ketchup ...", "ketchup_1", [["in", ...]]
    spec = tasks.base_scenario("libero_object", name) # LiberoScenario with the task's own instruction
    states = tasks.init_states("libero_object", name) # float64 (50, state_dim), MuJoCo flattened states

Why not import LIBERO: ``libero.libero`` asks ``input()`` without a config file, and
``libero.libero.benchmark`` imports torch at the top. The suite map is a Python literal in
``benchmark/libero_suite_task_map.py`` (read with ``ast.literal_eval``), a task's goal is in its
BDDL file (a small S-expression), and its language is derived from the task name exactly as
LIBERO's ``grab_language_from_filename`` does (the language VLAs are trained on). The
``.pruned_init`` files are a zip whose ``archive/data.pkl`` is one pickled numpy array: it is
read with an unpickler that accepts numpy's array classes and nothing else.

Plain Python and numpy: imports in the project's venv and in the LIBERO venv.
"""

from __future__ import annotations

import ast
import io
import pickle
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from producers.libero.exceptions import LiberoTaskError
from schemas.libero_scenario import DEFAULT_HORIZONS, SUITES, LiberoScenario

TASK_MAP_FILE = Path("benchmark") / "libero_suite_task_map.py"


def language_from_task_name(name: str) -> str:
    """LIBERO's grab_language_from_filename: underscores to spaces, the scene prefix of LIBERO-100
    tasks (``LIVING_ROOM_SCENE2_put_...``) dropped."""
    if name[:1].isupper():
        start = name.find("SCENE") + (8 if "SCENE10" in name else 7)
        return " ".join(name[start:].split("_"))
    return " ".join(name.split("_"))


def parse_sexpr(text: str) -> list:
    """A BDDL file as nested lists of lower-cased atoms (comments after ';' dropped)."""
    lines = [line.split(";", 1)[0] for line in text.splitlines()]
    tokens = " ".join(lines).replace("(", " ( ").replace(")", " ) ").split()
    stack: list[list] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) < 2:
                raise ValueError("unbalanced ')' in BDDL")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    if len(stack) != 1:
        raise ValueError("unbalanced '(' in BDDL")
    return stack[0]


def _section(problem: list, key: str) -> list | None:
    for item in problem:
        if isinstance(item, list) and item and item[0] == key:
            return item[1:]
    return None


def _typed_names(items: list) -> dict[str, str]:
    """``a b - cat c - cat2`` -> {a: cat, b: cat, c: cat2}."""
    out, pending = {}, []
    i = 0
    while i < len(items):
        tok = items[i]
        if tok == "-" and i + 1 < len(items):
            for name in pending:
                out[name] = items[i + 1]
            pending = []
            i += 2
            continue
        pending.append(tok)
        i += 1
    return out


def _flatten_goal(goal: list) -> list[list[str]]:
    """(And (In a b) (On c d)) -> [["in", a, b], ["on", c, d]] (lower case, as LIBERO's parser)."""
    if not goal:
        return []
    head = goal[0]
    if isinstance(head, str) and head.lower() == "and":
        return [p for sub in goal[1:] for p in _flatten_goal(sub)]
    if isinstance(head, list):
        return [p for sub in goal for p in _flatten_goal(sub)]
    return [[str(x).lower() for x in goal]]


@dataclass(frozen=True)
class TaskInfo:
    """What the BDDL file says about one task."""

    suite: str
    name: str
    instruction: str  # LIBERO's task language
    bddl_language: str  # the BDDL file's (:language ...) line
    objects: dict[str, str]  # movable object instance -> category
    fixtures: dict[str, str]  # fixture instance -> category
    obj_of_interest: tuple[str, ...]
    goal: tuple[tuple[str, ...], ...]  # predicates, e.g. (("in", "ketchup_1", "basket_1_contain_region"),)
    bddl_path: Path

    @property
    def target(self) -> str:
        """The object the goal is about: the first object argument of the first goal predicate
        (``in ketchup_1 basket_1_contain_region`` -> ketchup_1; ``open drawer_1`` -> drawer_1)."""
        for predicate in self.goal:
            if len(predicate) >= 2:
                return predicate[1]
        raise LiberoTaskError(f"task {self.suite}/{self.name} has no goal predicate with an object: {self.goal}")

    @property
    def pick_and_place(self) -> bool:
        """One goal predicate putting a movable object in or on something: what the scripted
        policies can do."""
        return (len(self.goal) == 1 and len(self.goal[0]) == 3 and self.goal[0][0] in ("in", "on")
                and self.goal[0][1] in self.objects)


class TaskCatalog:
    """The suites, tasks, BDDL files and init states of the LIBERO installed at ``package_dir``
    (``<site-packages>/libero/libero``)."""

    def __init__(self, package_dir: Path):
        self.package_dir = Path(package_dir)

    @cached_property
    def _map(self) -> dict[str, list[str]]:
        path = self.package_dir / TASK_MAP_FILE
        try:
            tree = ast.parse(path.read_text())
        except (OSError, SyntaxError) as exc:
            raise LiberoTaskError(f"cannot read LIBERO's suite map {path}: {exc}") from exc
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "libero_task_map"
                                                    for t in node.targets):
                value = ast.literal_eval(node.value)
                return {suite: list(value.get(suite, [])) for suite in SUITES}
        raise LiberoTaskError(f"{path} does not define libero_task_map")

    def suites(self) -> dict[str, list[str]]:
        return {s: list(t) for s, t in self._map.items()}

    def tasks(self, suite: str) -> list[str]:
        if suite not in self._map:
            raise LiberoTaskError(f"suite must be one of {SUITES}, got {suite!r}")
        return list(self._map[suite])

    def _check(self, suite: str, task: str) -> None:
        if task not in self.tasks(suite):
            raise LiberoTaskError(f"{task!r} is not a task of {suite} (it has {len(self.tasks(suite))} tasks: "
                                  f"`sepa-eval libero tasks --suite {suite}` lists them)")

    def bddl_path(self, suite: str, task: str) -> Path:
        self._check(suite, task)
        return self.package_dir / "bddl_files" / suite / f"{task}.bddl"

    def init_path(self, suite: str, task: str) -> Path:
        self._check(suite, task)
        return self.package_dir / "init_files" / suite / f"{task}.pruned_init"

    def info(self, suite: str, task: str) -> TaskInfo:
        path = self.bddl_path(suite, task)
        try:
            parsed = parse_sexpr(path.read_text())
        except (OSError, ValueError) as exc:
            raise LiberoTaskError(f"cannot read the BDDL file {path}: {exc}") from exc
        problem = parsed[0] if parsed and isinstance(parsed[0], list) else []
        language = _section(problem, ":language") or []
        objects = _typed_names(_section(problem, ":objects") or [])
        fixtures = _typed_names(_section(problem, ":fixtures") or [])
        interest = tuple(_section(problem, ":obj_of_interest") or [])
        goal_items = _section(problem, ":goal") or []
        goal = tuple(tuple(p) for p in _flatten_goal(goal_items[0] if goal_items else []))
        return TaskInfo(suite=suite, name=task, instruction=language_from_task_name(task),
                        bddl_language=" ".join(str(x) for x in language), objects=objects, fixtures=fixtures,
                        obj_of_interest=interest, goal=goal, bddl_path=path)

    def init_states(self, suite: str, task: str) -> Any:
        """The task's stored initial states: float64 numpy array (n, 1 + nq + nv)."""
        return load_init_states(self.init_path(suite, task))

    def base_scenario(self, suite: str, task: str, horizon: int | None = None,
                      init_state_index: int = 0) -> LiberoScenario:
        info = self.info(suite, task)
        return LiberoScenario(suite=suite, env_name=task, instruction=info.instruction,
                              horizon=horizon or DEFAULT_HORIZONS[suite], init_state_index=init_state_index)


class _NumpyOnly(pickle.Unpickler):
    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"),
               ("_codecs", "encode")}  # protocol-2 pickles spell bytes this way

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}: only numpy arrays are expected")
        return super().find_class(module, name)

    def persistent_load(self, pid):
        raise pickle.UnpicklingError(f"refusing a persistent id {pid!r} (a torch tensor file, not a numpy array)")


def load_init_states(path: Path) -> Any:
    """Reads a ``.pruned_init`` file (a zip holding ``archive/data.pkl``, one numpy array)."""
    import numpy as np

    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.endswith("data.pkl")]
            if not names:
                raise LiberoTaskError(f"{path} holds no data.pkl")
            data = z.read(names[0])
        states = _NumpyOnly(io.BytesIO(data)).load()
    except (OSError, zipfile.BadZipFile, pickle.UnpicklingError, EOFError) as exc:
        raise LiberoTaskError(f"cannot read LIBERO init states {path}: {exc}") from exc
    states = np.asarray(states, dtype=np.float64)
    if states.ndim != 2 or len(states) == 0:
        raise LiberoTaskError(f"{path}: expected a 2-d array of states, got shape {states.shape}")
    return states
