"""The FastAPI dependencies of the routes: the app's shared state (`Shared`: producer.http.state's
RouteState, from ``app.state.vela2``) and the caller's tenant (`Tenant`: the tenant of the request's
API key, None without authentication; a missing, unknown or not allowed key raises `Refused`, which
the app answers 401 / 403)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from producer.auth import Refusal
from producer.http.state import RouteState


class Refused(Exception):
    """A request refused by the API-key check (its Refusal: status, type, message)."""

    def __init__(self, refusal: Refusal):
        self.refusal = refusal


def route_state(request: Request) -> RouteState:
    """The state of the app serving the request."""
    state: RouteState = request.app.state.vela2
    return state


Shared = Annotated[RouteState, Depends(route_state)]


def caller(request: Request, state: Shared) -> str | None:
    """The tenant of the request's API key (None without authentication); raises Refused."""
    keys = state.settings.keys
    if keys is None:
        request.state.quotas = state.settings.quotas(None, None)  # keyless callers' (--quotas-file "")
        return None
    found = keys.check(request.headers.get("authorization"), state.settings.model)
    if isinstance(found, Refusal):
        raise Refused(found)
    # the key's limits, else its tenant's in --quotas-file (producer.quotas), for the routes that count
    request.state.quotas = state.settings.quotas(found.tenant, found.quotas)
    request.state.webhook_url = found.webhook_url  # its jobs' completion events (producer.webhooks)
    return found.tenant


Tenant = Annotated[str | None, Depends(caller)]
