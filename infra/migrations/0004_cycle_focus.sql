-- CycleStarted v2 names the ranked models tied at the top on the cycle's sweep: the mutator seeds
-- from their failures first (infra/orchestrator.py tied_top), and a replay shows why it did.
ALTER TABLE {database}.benchmark_cycles ADD COLUMN IF NOT EXISTS `focus_models` Array(String) AFTER `models`;
