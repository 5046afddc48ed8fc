-- EpisodeAnalysed carries the episode's seed: the clusterer passes over held-out seeds
-- (producers/seeds.py), and what was passed over stays visible in the log.
ALTER TABLE {database}.failure_episodes ADD COLUMN IF NOT EXISTS `seed` Nullable(Int64) AFTER `detector_version`;
