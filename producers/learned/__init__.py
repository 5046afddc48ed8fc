"""Learned reference policies that see pixels and read the instruction: trained on our own LeRobot
export of oracle demonstrations, served over openpi's protocol as users' VLAs are.

Everything here runs in the LeRobot venv (infra/lerobot_venv.py: Python 3.12, torch, LeRobot 0.6.1)
with this checkout on PYTHONPATH; nothing in the project's own venv imports it.

    python -m producers.learned.train --dataset DEMOS --output POLICY --steps 2000 --episodes 50 --seed 0
    python -m producers.learned.server --policy POLICY --port 8000      # ws://127.0.0.1:8000

- model.py: the network (a small CNN per camera, the proprioceptive state, a hashed bag of words of
  the instruction -> a chunk of actions) and its normalization, saved beside its training config.
- train.py: behaviour cloning through LeRobotDataset (frames decoded with PyAV), one seed, one budget.
- server.py: the openpi policy server (msgpack-numpy over WebSocket) for one trained policy.
"""
