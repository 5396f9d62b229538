"""The rollout brain: online metrics, gates, the staged-rollout state machine, the
policy/ingest HTTP service and the operator CLI. It never runs models.
"""
