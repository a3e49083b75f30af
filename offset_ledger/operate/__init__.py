"""The operator verbs: restart, adopt, replay, resets, reads and insight. Uses the rules, the ledger and the Kafka adapter; called by the faces."""

#: The front door: the modules of this layer that other layers may import (tests/unit/project/
#: test_layers.py holds every import to it). The rest are this layer's own rooms.
FRONT_DOOR = frozenset({
    "action_answers", "adopt", "alert_rules", "answers", "audit", "failover", "gc_pause", "inputs", "kcg", "known", "move_cost",
    "operations", "operations_metrics", "pipeline", "policy_view", "reads", "replay",
    "reset_operations", "restart", "restart_plan", "restart_preview", "verifying", "visibility"
})
