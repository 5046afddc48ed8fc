"""The critics of a candidate scenario: robustness (sequential rule), safety, semantic (VLM judge).

Each module here is pure decision logic over data the caller gathered (rollout outcomes, episode
quality and failure moments, keyframe files and a built chat client); the Kafka and evidence-log
wiring lives with the caller.
"""
