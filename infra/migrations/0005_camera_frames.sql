-- RolloutRequested v3 may ask for camera frames at every step, and Step v2 carries them by hash
-- (camera -> sha256 of the PNG in the keyframe store): demonstrations with pixels for learned
-- policies and LeRobot video exports. Frames themselves never enter the log.
ALTER TABLE {database}.rollout_requests ADD COLUMN IF NOT EXISTS `cameras` Array(String) AFTER `keyframe_every`;
ALTER TABLE {database}.rollout_requests ADD COLUMN IF NOT EXISTS `camera_size` Int32 DEFAULT 128 AFTER `cameras`;
ALTER TABLE {database}.rollout_steps ADD COLUMN IF NOT EXISTS `frames` Map(String, String) AFTER `keyframe_sha256`;
