"""A pipeline's stored policies as every face shows them: the API's camelCase names and GET answer.

The CLI's ``policy show -f json`` prints the same document as ``GET /api/v1/pipelines/{p}/policies``
(one vocabulary, issue 34); kept out of ``api/`` so the command line works without the server extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from offset_ledger.operate.answers import iso_utc
from offset_ledger.rules.policies import DEFAULTS, POLICY_KEYS

#: snake_case policy (ledger, Python, CLI) -> the API's camelCase field, in POLICY_KEYS order.
API_NAMES: dict[str, str] = {
    key: key.split("_")[0] + "".join(w.capitalize() for w in key.split("_")[1:]) for key in POLICY_KEYS}


def to_api(policies: Mapping[str, Any]) -> dict[str, Any]:
    """Ledger policies -> camelCase, in the documented order."""
    return {API_NAMES[k]: policies[k] for k in POLICY_KEYS if k in policies}


def change_dict(change: Any) -> dict[str, Any]:
    """One stored change (``ledger.policy_store``) as the API answers it."""
    return {"id": change.id, "createdAt": iso_utc(change.created_at), "actor": change.actor,
            "reason": change.reason, "policies": to_api(change.policies)}


def policies_document(pipeline: str, history: list[Any], stored: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The GET answer: stored policies, what a restart applies (stored, else the default), the last change.

    ``stored``: the policies to show instead of the last change's (a dry run's policies after it).
    """
    if stored is None:
        stored = dict(history[-1].policies) if history else {}
    return {
        "pipeline": pipeline,
        "policies": to_api(stored),
        "effective": {API_NAMES[k]: stored.get(k, DEFAULTS[k]) for k in POLICY_KEYS},
        "sources": {API_NAMES[k]: "stored" if k in stored else "default" for k in POLICY_KEYS},
        "lastChange": change_dict(history[-1]) if history else None,
    }
