"""API keys for tests of several tenants: a keys file and each tenant's Authorization header."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from producer.auth import new_key
from producer.quotas import Quotas


def tenant_keys(path: Path, tenants: dict[str, Quotas | None],
                shares: dict[str, float] | None = None) -> dict[str, dict[str, str]]:
    """Write a keys file at `path` with one new key per tenant (with its quotas, None: none, and its
    share in `shares`, absent: none); returns tenant -> its request headers."""
    lines, headers = [], {}
    for tenant, quotas in tenants.items():
        key, entry = new_key(tenant)
        lines.append(dataclasses.replace(entry, quotas=quotas, share=(shares or {}).get(tenant)).line())
        headers[tenant] = {"Authorization": f"Bearer {key}"}
    path.write_text("\n".join(lines) + "\n")
    return headers
