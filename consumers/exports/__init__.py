"""Hard-case exports: the episodes a policy failed (and, if asked, the ones it recovered in) out of
the evidence log, as JSON Lines (jsonl.py) or as a LeRobot v3.0 dataset (lerobot.py), selected by
the typed queries in queries.py."""
