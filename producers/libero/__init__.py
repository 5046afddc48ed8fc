"""LIBERO as a benchmark of SEPA-Eval: scenarios, tasks, the simulation adapter, scripted policies,
the openpi VLA client's observation layout and the rollout worker.

LIBERO needs robosuite 1.4, so the simulation parts (env.py, policies.py' oracle at run time,
worker.py) run in the LIBERO venv that ``sepa-eval libero setup`` builds (infra/libero_venv.py).
scenario.py and tasks.py are plain Python and import in both venvs: the project's CLI lists tasks
and builds base scenarios from the files inside the LIBERO venv without importing LIBERO.
"""
