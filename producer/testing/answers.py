"""What a fake worker answers with besides the stub: an answer function (`AnswerFn`: a row -> a
RowResult, or one answer per question), such as the real model run in this process
(`model_answerer`, ``answer="model"``; needs torch), and what such a function returned, made the
RowResult that is stored (`as_result`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from vela2.api.schemas import Answer, Row, RowResult, Status
from vela2.config import install_hint
from vela2.errors import ModelError

AnswerFn = Callable[[Row], Any]  # a row -> a RowResult, or one answer (Answer or dict) per question
MODEL = "model"


def model_answerer(checkpoint: str | Path, *, device: str = "cpu", precision: str | None = None) -> Any:
    """An answer function running the real model in this process: `vela2.predict` on the loaded
    `checkpoint`, at `precision` (default `vela2.config.default_precision(device)`, the worker's).
    The returned function carries the model's `calibration` (SystemOne default question texts).
    Needs torch (the `model` extra)."""
    try:
        from vela2.config import default_precision
        from vela2.model.checkpoint import load, serving_dtype
        from vela2.scoring.predict import predict
    except ImportError as e:
        raise ImportError(f'answer="model" runs the model in this process and needs torch, the \'model\' '
                          f'extra: {install_hint("model")} ({e})') from e
    chosen = precision or default_precision(device)
    model = load(checkpoint, device=device, dtype=serving_dtype(chosen))

    def answer(row: Row) -> RowResult:
        return predict(model, [row], precision=chosen)[0]

    answer.calibration = model.calibration  # type: ignore[attr-defined]
    answer.model_name = model.name  # type: ignore[attr-defined]
    return answer


def as_result(rid: str, row: Row, got: Any, timings: dict[str, float]) -> RowResult:
    """What an answer function returned, as the RowResult stored under `rid`."""
    if isinstance(got, RowResult):
        return got if got.id == rid else got.model_copy(update={"id": rid})
    if not isinstance(got, list | tuple):
        raise ModelError(f"the answer function returned {type(got).__name__}; expected a RowResult or a list "
                         f"of {len(row.questions)} answers")
    if len(got) != len(row.questions):
        raise ModelError(f"the answer function returned {len(got)} answers for {len(row.questions)} questions")
    answers = []
    for i, a in enumerate(got):
        if isinstance(a, Answer):
            answers.append(a)
        else:
            answers.append(Answer.model_validate({"question": i, "task": row.question_task(i), **dict(a)}))
    return RowResult(id=rid, task=row.task, status=Status.ok, answers=answers, timings=timings)
