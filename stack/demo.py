"""`vela2 demo`: the whole product on one machine, with nothing to set up.

An embedded Redis (redis-server on a free loopback port when installed, else an in-process
fakeredis TCP server), the demo checkpoint, one worker process (stack.harness.WorkerProcess),
sample requests of every kind submitted through producer.Client (choice, score, set, PII span, a
bundled row, a long windowed row, a SystemOne request, a bulk chunk, a bad row), their answers
and per-request timings printed, then a warm shutdown of the worker and Redis.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from producer.client import Client
from stack.harness import WorkerProcess, embedded_redis
from vela2.cli import Parser
from vela2.config import Vela2Config
from vela2.wire.results import read_answers
from vela2.wire.urls import ENV_BROKER_URL, mask_url

WORKER_START_TIMEOUT_S = 120.0  # model load + warm-up batch on a slow CPU
ANSWER_TIMEOUT_S = 120.0


def sample_requests(model_name: str) -> tuple[list[dict], dict, list[dict]]:
    """(online requests, a bad row, a bulk chunk of rows): every request type the product takes, over
    customer messages like the ones the demo model was trained on."""
    from vela2.train.demo_model import sample_rows
    from vela2.train.synthetic import QUESTIONS, SPAN_LABELS

    rows = sample_rows()
    long_choice = {
        "id": "demo-long-choice",
        "task": "choice:sentiment",
        "text": rows[-1]["text"],
        "questions": [QUESTIONS["choice:sentiment"]],
    }

    def task(name: str, kind: str, **kw: Any) -> dict[str, Any]:
        return {"name": name, "kind": kind, **kw}

    # The demo model learnt its questions' own texts and the kinds' default ones (classify and extract
    # always take theirs), so the SystemOne request asks both ways.
    system_one = {
        "model": model_name,
        "id": "demo-systemone",
        "input": ("Hi, my name is Carol Evans from Globex. I would like a refund for my last order. My bank card was "
                  "charged twice for the invoice. I really love the service, well done. Write to "
                  "carol.evans4@example.com or call +1-555-310-2288."),
        "tasks": [
            task("intent", "choice", **QUESTIONS["choice:intent"]),
            task("satisfaction", "score", **QUESTIONS["score:satisfaction"]),
            task("toxicity", "set", **QUESTIONS["set:toxicity"]),
            task("sentiment", "classify", labels=QUESTIONS["choice:sentiment"]["options"]),
            task("pii", "span", labels=SPAN_LABELS),
        ],
    }
    bad = {"id": "demo-bad", "task": "choice:sentiment", "text": "No options here.",
           "questions": [{"options": ["yes"]}]}
    bulk_texts = [  # short messages (positive, negative, neutral)
        "Hello, this is Emma Brown at Wonka. When will my order be delivered? I really love the service, well done.",
        "My password does not work any more. Your support is awful and slow.",
        "Dear team, I am Rosa Hill from Duff. Please cancel my subscription from next month. Here are the details "
        "of the case.",
    ]
    chunk = [{"id": f"demo-bulk-{i}", "task": "choice:sentiment", "text": text,
              "questions": [QUESTIONS["choice:sentiment"]]} for i, text in enumerate(bulk_texts)]
    return [*rows, long_choice, system_one], bad, chunk


def _describe(answer: dict[str, Any]) -> str:
    """A short human line for an answer (row result or SystemOne answer)."""
    if answer.get("status") != "ok":
        err = answer.get("error") or {}
        return f"{answer.get('status')}: {err.get('type')}: {err.get('message')}"
    parts = []
    items = (
        [(a.get("task"), a) for a in answer["answers"]]
        if "answers" in answer
        else [(name, a) for name, a in answer.get("tasks", {}).items()]
    )
    for name, a in items:
        if a.get("spans") is not None:
            spans = ", ".join(f"{s['label']}={s['text']!r}" for s in a["spans"][:6])
            more = f" (+{len(a['spans']) - 6})" if len(a["spans"]) > 6 else ""
            gate = " gate fired" if a.get("gate_fired") else ""
            parts.append(f"{name}: [{spans}{more}]{gate}")
        else:
            top = max(a["probs"].items(), key=lambda kv: kv[1])
            extra = f" expected={a['expected']:.2f}" if a.get("expected") is not None else ""
            parts.append(f"{name}: {json.dumps(a.get('decision'))} (top {top[0]} {top[1]:.2f}){extra}")
    return "; ".join(parts)


def _short(text: str, limit: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _asked(request: dict[str, Any]) -> str:
    """What a request asked, in one short line: its text (shortened) and each question."""
    if "tasks" in request:  # a SystemOne request
        inp = request["input"]
        text = inp if isinstance(inp, str) else " | ".join(f"{k}: {v}" for k, v in inp.items())
        asks = [f"{t['name']} ({t['kind']}: {', '.join(t.get('options') or t.get('labels') or [])})"
                for t in request["tasks"]]
    else:
        text = request.get("text", "")
        asks = [q.get("question") or f"[{', '.join(q.get('options') or q.get('labels') or [])}]"
                for q in request.get("questions", [])]
    return f"text {_short(text)!r}; asked: {'; '.join(asks)}"


def _held_out_line(checkpoint: Path) -> str | None:
    """One line of the checkpoint's held-out scores (`vela2 init-demo` writes them), or None without them."""
    from vela2.train.demo_eval import HELD_OUT_FILE

    path = checkpoint / HELD_OUT_FILE
    if not path.is_file():
        return None
    report = json.loads(path.read_text(encoding="utf-8"))
    held = report["held_out"]
    scores = [f"{label} F1 {e['f1']:.2f}" for label, e in held["spans"].items()]
    scores += [f"{task.split(':')[1]} {e['accuracy']:.2f}" for task, e in held["choices"].items()]
    missed = "; ".join(m.split(" (")[0] for m in report["goals_missed"]) or "none"
    return f"on messages unlike its training data ({HELD_OUT_FILE}): {', '.join(scores)}; goals missed: {missed}"


def _beyond(request: dict[str, Any]) -> str | None:
    """A note for a request longer than any message the demo model was trained on, else None."""
    from vela2.text.rendering import split_words
    from vela2.train.synthetic import LONGEST_MESSAGE_WORDS

    text = request.get("text")
    if not isinstance(text, str) or len(split_words(text)) <= LONGEST_MESSAGE_WORDS:
        return None
    return (f"(beyond the demo's training: {len(split_words(text)):,} words, read in overlapping windows; it was "
            f"trained on messages of at most {LONGEST_MESSAGE_WORDS} words)")


def _print_answers(ids: list[str], answers: dict[str, Any], seen_ms: dict[str, float],
                   requests: dict[str, dict[str, Any]] | None = None) -> None:
    print(f"{'request':<18} {'queue':>7} {'render':>7} {'model':>7} {'decode':>7} {'total':>8}  answer")
    for rid in ids:
        answer = answers.get(rid)
        if answer is None:
            print(f"{rid:<18} {'-':>7} {'-':>7} {'-':>7} {'-':>7} {'-':>8}  NO ANSWER")
            continue
        t = answer.get("timings") or {}
        cols = " ".join(
            f"{t[k]:7.1f}" if k in t else f"{'-':>7}" for k in ("queue_ms", "render_ms", "model_ms", "decode_ms")
        )
        print(f"{rid:<18} {cols} {seen_ms.get(rid, 0.0):8.1f}  {_describe(answer)}")
        if requests and rid in requests:
            print(f"{'':<18} {_asked(requests[rid])}")
            if note := _beyond(requests[rid]):
                print(f"{'':<18} {note}")
    print("(milliseconds; total = submit -> answer seen by the client)")


def _collect(client: Client, ids: list[str], t0: float, timeout_s: float) -> tuple[dict[str, Any], dict[str, float]]:
    """Poll answers (one MGET per poll) and note when each was first seen."""
    answers: dict[str, Any] = {}
    seen_ms: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(answers) < len(ids) and time.monotonic() < deadline:
        missing = [i for i in ids if i not in answers]
        for rid, answer in read_answers(client.redis, missing).items():
            if answer is not None:
                answers[rid] = answer
                seen_ms[rid] = (time.monotonic() - t0) * 1e3
        time.sleep(0.005)
    return answers, seen_ms


def _stats_line(stats: dict[str, Any] | None) -> str:
    if stats is None:
        return "no engine stats (it did not stop warmly)"
    r = stats["results"]
    return (f"answered {stats['answered']} requests (ok {r['ok']}, error {r['error']}, expired {r['expired']}), "
            f"{stats['duplicates']} duplicates skipped; acked {stats['messages_acked']} messages, returned "
            f"{stats['messages_returned']} to the queue; {stats['batches']} batches")


def run_demo(checkpoint: str | Path | None = None, *, max_batch_tokens: int = 4096, max_wait_ms: float = 10.0,
             broker_url: str | None = None) -> int:
    """Run the demo; returns 0 when every request was answered and the worker shut down cleanly.
    `broker_url`: queue on this broker instead of the embedded Redis (which still holds the results)."""
    with tempfile.TemporaryDirectory(prefix="vela2-demo-") as tmp:
        work = Path(tmp)
        if checkpoint is None:
            import vela2

            print("writing the demo checkpoint ...", flush=True)
            checkpoint = vela2.init_demo(work / "checkpoint")
        model_name = Vela2Config.read(checkpoint).name
        with embedded_redis(work) as (url, what):
            print(f"redis: {what}")
            if broker_url:
                print(f"broker: {mask_url(broker_url)}")
            worker = WorkerProcess.start(url, checkpoint, work / "worker.log", name="vela2-demo", broker_url=broker_url,
                                         max_batch_tokens=max_batch_tokens, max_wait_ms=max_wait_ms)
            ids: list[str] = []
            answers: dict[str, Any] = {}
            try:
                try:
                    worker.wait_ready(WORKER_START_TIMEOUT_S)
                except RuntimeError as e:
                    print(f"demo FAILED: {e}")
                    return 1
                print(f"worker ready in {worker.ready_s:.1f} s (pid {worker.pid}, model {model_name})")
                from vela2.train.demo_model import DESCRIPTION_FILE  # late: vela2.train.demo_model imports torch

                about = Path(checkpoint) / DESCRIPTION_FILE
                print(f"the model: {about.read_text().strip() if about.is_file() else model_name}")
                if scores := _held_out_line(Path(checkpoint)):
                    print(scores)
                client = Client(url, model=model_name, broker_url=broker_url)
                online, bad, chunk = sample_requests(model_name)
                t0 = time.monotonic()
                ids = [client.submit(r) for r in online]
                ids.append(client.submit(bad, validate=False))  # let the worker answer it
                ids += client.submit_many(chunk, backfill=True, chunk_size=len(chunk))
                answers, seen_ms = _collect(client, ids, t0, ANSWER_TIMEOUT_S)
                print(
                    f"\n{len(ids)} requests ({len(online)} online, 1 bad, a bulk chunk of {len(chunk)}); "
                    f"all answered in {max(seen_ms.values(), default=0):.0f} ms\n"
                )
                _print_answers(ids, answers, seen_ms, {r["id"]: r for r in [*online, bad, *chunk]})
                client.close()
            finally:
                code = worker.terminate(60)
            print(f"\nworker stopped (exit code {code}): {_stats_line(worker.engine_stats())}")
        missing = [i for i in ids if i not in answers]
        if missing or code != 0:
            print(f"demo FAILED: {len(missing)} unanswered {missing[:5]}; worker exit code {code}")
            print(worker.log()[-3000:])
            return 1
        print("demo OK")
        return 0


def answer(request: dict[str, Any], checkpoint: str | Path) -> dict[str, Any]:
    """The demo model's real answer to `request` (a SystemOne request or a row), computed in this process as a
    CPU worker computes it (fp32): what the docs' example answers are regenerated with. `timings` (which
    vary from run to run) are left out."""
    import torch

    import vela2
    from vela2.api.systemone import is_system_one

    model = vela2.load(checkpoint, dtype=torch.float32)
    if is_system_one(request):
        out = vela2.system_one_request(model, request, precision="fp32")
    else:
        [result] = vela2.predict(model, [request], precision="fp32")
        out = result.to_json_dict()
    out.pop("timings", None)
    return out


def main(argv: list[str]) -> int:
    """the main job: embedded Redis, a worker, sample requests of every kind, answers"""
    ap = Parser(prog="vela2 demo", description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", help="demo checkpoint to use (default: written to a temporary folder)")
    ap.add_argument("--broker", default=os.environ.get(ENV_BROKER_URL) or None,
                    help=f"queue on this broker (default ${ENV_BROKER_URL}; else the embedded Redis)")
    ap.add_argument("--answer", metavar="REQUEST_JSON",
                    help="print the model's answer (JSON) to the SystemOne request or row in this file and exit; "
                         "needs --checkpoint (no Redis, no worker)")
    args = ap.parse_args(argv)
    if args.answer:
        if not args.checkpoint:
            ap.error("--answer needs --checkpoint DIR (`make demo` writes one to .cache/vela2-demo)")
        request = json.loads(Path(args.answer).read_text(encoding="utf-8"))
        print(json.dumps(answer(request, args.checkpoint), indent=1))
        return 0
    return run_demo(args.checkpoint, broker_url=args.broker)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
