"""Assertions for tests of code that submits requests: `assert_ok`."""

from __future__ import annotations

from typing import Any

from vela2.api.schemas import RowResult, Status


def assert_ok(answer: Any) -> Any:
    """`answer` (a RowResult, an answer dict from `Client.answer` / `answers_many`, or the JSON of
    an HTTP response) when its status is "ok"; else AssertionError with the stored error's type and
    message (None: no answer yet). Returns it, so ``assert_ok(client.result(rid)).answers`` reads."""
    if answer is None:
        raise AssertionError("no answer (None): the request has no stored result yet")
    data = answer.to_json_dict() if isinstance(answer, RowResult) else answer
    if not isinstance(data, dict):
        raise AssertionError(f"not an answer: {type(answer).__name__} {str(answer)[:200]}")
    status = data.get("status")
    if status == Status.ok.value:
        return answer
    err = data.get("error") or {}
    raise AssertionError(f"request {data.get('id')!r} is {status!r}, not 'ok': "
                         f"{err.get('type', '?')}: {err.get('message', '(no message)')}")
