-- Schema v2 (evolving loop): new topics failures.episodes and benchmark.cycles, new fields with
-- their Avro defaults, and the ScenarioSpec tuple extended in place (named tuples grow by MODIFY COLUMN).

ALTER TABLE {database}.rollout_requests MODIFY COLUMN `scenario` Tuple(scenario_id String, parent_id Nullable(String), benchmark String, env_name String, robot String, horizon Int32, instruction String, placement_x_range Array(Float64), placement_y_range Array(Float64), pose_offset_xyz Array(Float64), object_friction Nullable(Float64), object_mass Nullable(Float64), object_rgba Array(Float64), object_size_scale Float64, distractors Array(Tuple(kind String, size Float64, x Float64, y Float64)), seed Int64, success_hold_steps Int32, place_target_xy Array(Float64), suite String, init_state_index Int32, perturbations Map(String, Float64));

ALTER TABLE {database}.rollout_episodes MODIFY COLUMN `scenario` Tuple(scenario_id String, parent_id Nullable(String), benchmark String, env_name String, robot String, horizon Int32, instruction String, placement_x_range Array(Float64), placement_y_range Array(Float64), pose_offset_xyz Array(Float64), object_friction Nullable(Float64), object_mass Nullable(Float64), object_rgba Array(Float64), object_size_scale Float64, distractors Array(Tuple(kind String, size Float64, x Float64, y Float64)), seed Int64, success_hold_steps Int32, place_target_xy Array(Float64), suite String, init_state_index Int32, perturbations Map(String, Float64));

ALTER TABLE {database}.rollout_episodes ADD COLUMN IF NOT EXISTS `variant` String AFTER `seed`;

ALTER TABLE {database}.rollout_episodes ADD COLUMN IF NOT EXISTS `simulator` String AFTER `variant`;

CREATE TABLE IF NOT EXISTS {database}.failure_episodes (
  `envelope` Tuple(event_id String, event_type String, event_time DateTime64(6, 'UTC'), producer String, run_id String, schema_version Int32),
  `episode_id` String,
  `scenario_id` String,
  `model_id` String,
  `scenario` Tuple(scenario_id String, parent_id Nullable(String), benchmark String, env_name String, robot String, horizon Int32, instruction String, placement_x_range Array(Float64), placement_y_range Array(Float64), pose_offset_xyz Array(Float64), object_friction Nullable(Float64), object_mass Nullable(Float64), object_rgba Array(Float64), object_size_scale Float64, distractors Array(Tuple(kind String, size Float64, x Float64, y Float64)), seed Int64, success_hold_steps Int32, place_target_xy Array(Float64), suite String, init_state_index Int32, perturbations Map(String, Float64)),
  `success` Bool,
  `termination` String,
  `steps` Int32,
  `quality` Tuple(smoothness_jerk Float64, path_efficiency Float64, peak_contact_force Float64, mean_contact_force Float64, time_to_success Nullable(Int32), regrasp_count Int32, idle_steps Int32),
  `analysed` Bool,
  `reason` String,
  `moments` Array(Tuple(moment_id String, failure_type String, step Int32, severity Float64, features Map(String, Float64), recovered_step Int32, recovery String)),
  `detector_version` String,
  _ingested_at DateTime64(6, 'UTC') DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
ORDER BY (episode_id, envelope.event_id);

ALTER TABLE {database}.failure_clusters ADD COLUMN IF NOT EXISTS `model_id` String AFTER `clusterer_version`;

ALTER TABLE {database}.failure_clusters ADD COLUMN IF NOT EXISTS `intake` Bool AFTER `model_id`;

ALTER TABLE {database}.failure_clusters ADD COLUMN IF NOT EXISTS `revision` Int64 AFTER `intake`;

ALTER TABLE {database}.failure_clusters ADD COLUMN IF NOT EXISTS `position` Int64 AFTER `revision`;

ALTER TABLE {database}.failure_clusters ADD COLUMN IF NOT EXISTS `failure_types` Map(String, Float64) AFTER `summary_source`;

ALTER TABLE {database}.failure_clusters ADD COLUMN IF NOT EXISTS `root_types` Map(String, Float64) AFTER `failure_types`;

ALTER TABLE {database}.failure_clusters ADD COLUMN IF NOT EXISTS `model_counts` Map(String, Int64) AFTER `root_types`;

ALTER TABLE {database}.failure_clusters ADD COLUMN IF NOT EXISTS `scenario_counts` Map(String, Int64) AFTER `model_counts`;

ALTER TABLE {database}.failure_clusters ADD COLUMN IF NOT EXISTS `site` Map(String, Float64) AFTER `scenario_counts`;

ALTER TABLE {database}.failure_clusters ADD COLUMN IF NOT EXISTS `representative_scenario` Tuple(scenario_id String, parent_id Nullable(String), benchmark String, env_name String, robot String, horizon Int32, instruction String, placement_x_range Array(Float64), placement_y_range Array(Float64), pose_offset_xyz Array(Float64), object_friction Nullable(Float64), object_mass Nullable(Float64), object_rgba Array(Float64), object_size_scale Float64, distractors Array(Tuple(kind String, size Float64, x Float64, y Float64)), seed Int64, success_hold_steps Int32, place_target_xy Array(Float64), suite String, init_state_index Int32, perturbations Map(String, Float64)) AFTER `site`;

ALTER TABLE {database}.scenario_candidates MODIFY COLUMN `scenario` Tuple(scenario_id String, parent_id Nullable(String), benchmark String, env_name String, robot String, horizon Int32, instruction String, placement_x_range Array(Float64), placement_y_range Array(Float64), pose_offset_xyz Array(Float64), object_friction Nullable(Float64), object_mass Nullable(Float64), object_rgba Array(Float64), object_size_scale Float64, distractors Array(Tuple(kind String, size Float64, x Float64, y Float64)), seed Int64, success_hold_steps Int32, place_target_xy Array(Float64), suite String, init_state_index Int32, perturbations Map(String, Float64));

ALTER TABLE {database}.scenario_candidates ADD COLUMN IF NOT EXISTS `factor` String AFTER `mutator_version`;

ALTER TABLE {database}.scenario_candidates ADD COLUMN IF NOT EXISTS `generator` String AFTER `factor`;

ALTER TABLE {database}.scenario_candidates ADD COLUMN IF NOT EXISTS `cycle_id` String AFTER `generator`;

ALTER TABLE {database}.scenario_candidates ADD COLUMN IF NOT EXISTS `feasibility_json` String AFTER `cycle_id`;

ALTER TABLE {database}.critic_verdicts ADD COLUMN IF NOT EXISTS `rollouts` Int32 AFTER `evidence_json`;

ALTER TABLE {database}.benchmark_decisions ADD COLUMN IF NOT EXISTS `checks_json` String AFTER `gate_version`;

ALTER TABLE {database}.benchmark_decisions ADD COLUMN IF NOT EXISTS `benchmark_version` Int32 AFTER `checks_json`;

ALTER TABLE {database}.benchmark_decisions ADD COLUMN IF NOT EXISTS `scenario` Tuple(scenario_id String, parent_id Nullable(String), benchmark String, env_name String, robot String, horizon Int32, instruction String, placement_x_range Array(Float64), placement_y_range Array(Float64), pose_offset_xyz Array(Float64), object_friction Nullable(Float64), object_mass Nullable(Float64), object_rgba Array(Float64), object_size_scale Float64, distractors Array(Tuple(kind String, size Float64, x Float64, y Float64)), seed Int64, success_hold_steps Int32, place_target_xy Array(Float64), suite String, init_state_index Int32, perturbations Map(String, Float64)) AFTER `benchmark_version`;

ALTER TABLE {database}.benchmark_decisions ADD COLUMN IF NOT EXISTS `parent_scenario_id` String AFTER `scenario`;

ALTER TABLE {database}.benchmark_decisions ADD COLUMN IF NOT EXISTS `source_cluster_id` String AFTER `parent_scenario_id`;

ALTER TABLE {database}.benchmark_decisions ADD COLUMN IF NOT EXISTS `factor` String AFTER `source_cluster_id`;

CREATE TABLE IF NOT EXISTS {database}.benchmark_cycles (
  `envelope` Tuple(event_id String, event_type String, event_time DateTime64(6, 'UTC'), producer String, run_id String, schema_version Int32),
  `cycle_id` String,
  `cycle` Int32,
  `benchmark_version` Int32,
  `clusters_position` Int64,
  `generator` String,
  `max_candidates` Int32,
  `seed` Int64,
  `models` Array(String),
  `seeds` Array(String),
  `proposed` Array(String),
  `infeasible` Map(String, String),
  `mutator_version` String,
  _ingested_at DateTime64(6, 'UTC') DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
ORDER BY (cycle_id, envelope.event_id);
