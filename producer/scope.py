"""A client's tenant (`Scope`): the ids a tenant sends travel and are stored as `<tenant>/<id>`
(vela2.wire.keys.scoped_id), so two tenants' equal ids never meet; every read maps them back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vela2.api.schemas import RowResult
from vela2.config import LIMITS
from vela2.errors import IdConflict, InvalidRequest, LimitExceeded
from vela2.wire.jobs import reserved_id
from vela2.wire.keys import id_problem, scoped_id, tenant_problem, unscoped_id


@dataclass(frozen=True)
class Scope:
    """A client's tenant: the ids it sends travel and are stored as `<tenant>/<id>`
    (vela2.wire.keys.scoped_id), so two tenants' equal ids never meet; every read maps them back,
    answers included. No tenant: ids as given (the default)."""

    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.tenant is not None and (problem := tenant_problem(self.tenant)):
            raise InvalidRequest(problem)

    def wire(self, rid: str) -> str:
        """The id as it travels and is stored; InvalidRequest for one no request can have (not a
        string, empty, over the limit, not encodable: e.g. a lone surrogate)."""
        if problem := id_problem(rid):
            raise InvalidRequest(f"id {problem}")
        return scoped_id(self.tenant, rid)

    def wire_items(self, items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Prepared (id, request) pairs as they travel; LimitExceeded when a scoped id is too long,
        IdConflict for an id of a bulk job line's form (vela2.wire.jobs.reserved_id)."""
        for rid, _ in items:
            if reserved_id(rid):
                raise IdConflict(f"id {rid!r} has the form of a bulk job line's (batch_<32 hex>#<line>), which "
                                 "only jobs may use: choose another id", [rid])
        if self.tenant is None:
            return items
        out = []
        for rid, obj in items:
            wire = self.wire(rid)
            if len(wire) > LIMITS.max_id_chars:
                room = LIMITS.max_id_chars - len(scoped_id(self.tenant, ""))
                raise LimitExceeded(f"id {rid[:40]!r}... has {len(rid):,} characters; under tenant "
                                    f"{self.tenant!r} the limit is {room:,}")
            out.append((wire, {**obj, "id": wire} if isinstance(obj, dict) else obj))
        return out

    def caller(self, wire: str) -> str:
        """The caller's id of a wire id."""
        return unscoped_id(self.tenant, wire)

    def back(self, value: Any, wire: str) -> Any:
        """A read value (RowResult, answer dict or None) with the caller's id in place of `wire`."""
        if self.tenant is None or value is None:
            return value
        user = self.caller(wire)
        if isinstance(value, RowResult):
            return value.model_copy(update={"id": user}) if value.id == wire else value
        if isinstance(value, dict) and value.get("id") == wire:
            return {**value, "id": user}
        return value
