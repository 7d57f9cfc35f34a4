"""SystemOne requests answered with a loaded model, with no queue: `system_one_request` (one
request) and `predict_mixed` (a mix of rows and requests in one predict() call, as `vela2 predict`
reads them). Each request runs parse -> check_model -> to_row (vela2.api.systemone) -> predict()
-> to_answer: the answer's numbers are predict()'s own."""

from __future__ import annotations

import logging
from typing import Any

from vela2.api.systemone import check_model, error_answer, is_system_one, parse_request, to_answer, to_row
from vela2.errors import Vela2Error
from vela2.scoring.predict import predict

# The name the logger had when these functions lived in vela2.api.systemone: log lines and the
# filters set on them stay as they were.
logger = logging.getLogger("vela2.api.systemone")


def _predict_kwargs(precision: str | None, max_batch_tokens: int | None) -> dict[str, Any]:
    """The keyword arguments of predict() that were given (the others keep predict()'s defaults)."""
    kw: dict[str, Any] = {}
    if precision is not None:
        kw["precision"] = precision
    if max_batch_tokens is not None:
        kw["max_batch_tokens"] = max_batch_tokens
    return kw


def system_one_request(
    model: Any, request: Any, *, precision: str | None = None, max_batch_tokens: int | None = None
) -> dict[str, Any]:
    """Answer one SystemOne request: parse -> check_model -> to_row -> vela2.predict -> to_answer.

    Never raises for a bad request: any Vela2Error becomes an error answer naming the problem.
    `precision` / `max_batch_tokens` are passed to `vela2.predict` when given.
    """
    parsed: Any = request
    try:
        parsed = parse_request(request)
        check_model(parsed, model.name)
        row = to_row(parsed, model.calibration)
        (result,) = predict(model, [row], **_predict_kwargs(precision, max_batch_tokens))
        return to_answer(parsed, result)
    except Vela2Error as e:
        logger.info("SystemOne request refused: %s", e)
        return error_answer(parsed, e)


def predict_mixed(
    model: Any, objs: list[Any], *, precision: str | None = None, max_batch_tokens: int | None = None
) -> list[dict[str, Any]]:
    """Answer a mix of rows and SystemOne requests (told apart by `is_system_one`) in one predict() call.

    Returns one JSON dict per input, in order: rows get `RowResult.to_json_dict()`, SystemOne
    requests their answer (an error answer when invalid; the others still run). This is what
    `vela2 predict` needs for a file whose lines mix both.
    """
    rows: list[Any] = []
    plan: list[tuple[str, Any, int]] = []  # (kind, parsed request or error answer, index into rows)
    for obj in objs:
        if not is_system_one(obj):
            plan.append(("row", None, len(rows)))
            rows.append(obj)
            continue
        parsed: Any = obj
        try:
            parsed = parse_request(obj)
            check_model(parsed, model.name)
            rows.append(to_row(parsed, model.calibration))
            plan.append(("s1", parsed, len(rows) - 1))
        except Vela2Error as e:
            plan.append(("err", error_answer(parsed, e), -1))
    results = predict(model, rows, **_predict_kwargs(precision, max_batch_tokens)) if rows else []
    out: list[dict[str, Any]] = []
    for kind, item, idx in plan:
        if kind == "row":
            out.append(results[idx].to_json_dict())
        elif kind == "err":
            out.append(item)
        else:
            try:
                out.append(to_answer(item, results[idx]))
            except Vela2Error as e:
                out.append(error_answer(item, e))
    return out
