"""From a request to the messages queued, at the caller: `prepare_request` validates one request with
the worker's own validators and messages (so a bad request fails here, before anything is queued)
and gives it the id it is answered under; `pack_messages` packs prepared requests into Celery
messages (one per request, or chunks), split where one would pass the message size limit.

Rows are validated with `vela2.api.schemas.parse_row`, SystemOne requests with
`vela2.api.systemone.parse_request` (imported on first use: it pulls numpy). No celery, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from vela2.api.schemas import parse_row
from vela2.config import LIMITS
from vela2.errors import LimitExceeded, ModelMismatch, Vela2Error
from vela2.wire import tracing
from vela2.wire.messages import Message, build_message, with_id


def _as_json(request: Any) -> Any:
    """A pydantic request (Row, SystemOneRequest) as its JSON dict; anything else as given."""
    if isinstance(request, BaseModel):
        return request.model_dump(mode="json", exclude_none=True)
    return request


def prepare_request(request: Any, model: str, *, validate: bool = True) -> tuple[str, Any]:
    """Validate one request for `model` at the caller -> (id it is answered under, object to send).

    Raises InvalidRequest / LimitExceeded (the worker's own messages) or ModelMismatch for a
    SystemOne request naming another model. Rows without an id get their content id.
    `validate=False` only assigns the id.
    """
    obj = _as_json(request)
    if validate:
        # Imported on use: vela2.api.systemone pulls numpy (vela2.model.calibration), which a client that only
        # sends rows does not need.
        from vela2.api import systemone

        if systemone.is_system_one(obj):
            parsed = systemone.parse_request(obj)
            if parsed.model != model:
                raise ModelMismatch(f"request names model {parsed.model!r}; this client submits to {model!r}")
            check_words(systemone.render_checked(parsed.input)[0])
        else:
            check_words(parse_row(obj).text)
    return with_id(obj)


def check_words(text: str) -> None:
    """The worker's word limit (LIMITS.max_text_words, words as vela2.text.rendering splits them), checked
    at the caller: LimitExceeded with the worker's message. A text of at most that many characters
    cannot have more words, so only longer ones are split (the splitter is imported on first use)."""
    if len(text) <= LIMITS.max_text_words:
        return
    from vela2.text.rendering import split_words

    n_words = len(split_words(text))
    if n_words > LIMITS.max_text_words:
        raise LimitExceeded(f"text has {n_words:,} words; limit {LIMITS.max_text_words:,}")


def prepare_many(requests: Iterable[Any], model: str, *, validate: bool = True) -> list[tuple[str, Any]]:
    """`prepare_request` over many; an error names the request's index (`requests[3]: ...`).
    `validate=False` only assigns ids (see Client.submit)."""
    out: list[tuple[str, Any]] = []
    for i, r in enumerate(requests):
        try:
            out.append(prepare_request(r, model, validate=validate))
        except Vela2Error as e:
            raise type(e)(f"requests[{i}]: {e}") from None
    return out


def pack_messages(
    items: list[tuple[str, Any]],
    queue: str,
    *,
    chunk_size: int = 1,
    expires: datetime | None = None,
    max_message_bytes: int = LIMITS.max_message_bytes,
    job: str | None = None,
    tenant: str | None = None,
) -> list[Message]:
    """Messages for prepared (id, object) pairs, in order: one per request when chunk_size <= 1,
    else chunks of up to chunk_size requests. A chunk over max_message_bytes is split in halves; a
    single request over it raises LimitExceeded naming its id. `job`: the bulk job they belong to;
    `tenant`: the tenant their ids are scoped to (the messages wait on its list: fair share)."""
    out: list[Message] = []

    def build(part: list[tuple[str, Any]]) -> None:
        try:
            out.append(
                build_message(
                    [obj for _, obj in part],
                    queue,
                    chunk=chunk_size > 1,
                    expires=expires,
                    max_message_bytes=max_message_bytes,
                    extra_headers=tracing.message_headers(queue, tuple(rid for rid, _ in part)),
                    job=job,
                    tenant=tenant,
                )
            )
        except LimitExceeded as e:
            if len(part) == 1:
                raise LimitExceeded(f"request {part[0][0]!r}: {e}") from None
            half = len(part) // 2
            build(part[:half])
            build(part[half:])

    step = max(1, chunk_size)
    for k in range(0, len(items), step):
        build(items[k : k + step])
    return out
