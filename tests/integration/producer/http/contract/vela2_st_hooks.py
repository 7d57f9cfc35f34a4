"""Schemathesis hooks of the contract run (SCHEMATHESIS_HOOKS=vela2_st_hooks).

The request schema states every rule of one field; the rules JSON Schema cannot state are written in
its description (vela2.api.systemone.CROSS_FIELD_RULES). Generated bodies breaking one of those that
concern a body's shape (two tasks of one name; a task's `fields` naming what is not a key of
`input`) are not sent: the server refuses them (422), as the description says. Nor are cases naming
a `webhook_url`: one is accepted only for an origin the operator allows (`--webhook-allow`), a rule of
the deployment that no schema states (tests/integration/producer/http/test_webhooks.py covers it). A
bulk job's JSONL body goes on the wire as text.
"""

from __future__ import annotations

from typing import Any

import schemathesis

# POST /v1/batches takes a JSONL body (a string in the schema): sent as text, as a client sends a file
schemathesis.serializer.alias("application/jsonl", "text/plain")


def breaks_a_cross_field_rule(body: Any) -> bool:
    """True when `body` has two tasks of one name, or a task whose fields are not keys of `input`."""
    if not isinstance(body, dict) or not isinstance(body.get("tasks"), list):
        return False
    tasks = [t for t in body["tasks"] if isinstance(t, dict)]
    names = [repr(t.get("name")) for t in tasks]
    if len(names) != len(set(names)):
        return True
    keys = body.get("input") if isinstance(body.get("input"), dict) else {}
    for task in tasks:
        fields = task.get("fields")
        if isinstance(fields, list) and any(not isinstance(f, str) or f not in keys for f in fields):
            return True
    return False


def names_a_webhook(case: Any) -> bool:
    """True when the case names a webhook_url (in a batch-create body or the JSONL route's query)."""
    in_body = isinstance(case.body, dict) and case.body.get("webhook_url") is not None
    return in_body or (case.query or {}).get("webhook_url") is not None


@schemathesis.hook
def filter_case(ctx: Any, case: Any) -> bool:
    """Every phase's cases (the coverage phase's too) pass here before they are sent."""
    return not breaks_a_cross_field_rule(case.body) and not names_a_webhook(case)
