"""`vela2 predict`: one result line per input line, in order, bad lines as well-formed errors next to
rows and SystemOne requests, `--units`, stdin/stdout, the summary; the packages' subcommands and
plugins; the default precision."""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pytest

import vela2
from vela2.cli import main
from vela2.scoring.systemone import system_one_request
from vela2.text.rendering import split_words

TEXT = "Alice Smith from Acme wrote to bob@globex.com about the refund for order 4471 on Monday."
ROW = {
    "id": "row-1",
    "task": "choice:boolq",
    "text": TEXT,
    "questions": [{"question": "Is it polite?", "options": ["yes", "no"]}],
}
SPAN_ROW = {"id": "row-2", "task": "span:pii_cli", "text": TEXT, "questions": [{"labels": ["person", "email"]}]}
S1 = {
    "model": "vela2-demo",
    "id": "req-1",
    "input": {"user": "Hi, I am Alice.", "assistant": "Hello Alice!"},
    "tasks": [
        {"name": "intent", "kind": "choice", "options": ["greeting", "complaint"]},
        {"name": "pii", "kind": "span", "labels": ["person"], "fields": ["user"]},
    ],
}
S1_BAD_MODEL = {**S1, "id": "req-2", "model": "vela2-9b"}
BAD_ROW = {"id": "row-bad", "task": "choice:boolq", "text": TEXT, "questions": [{"options": ["yes"]}]}

LINES = [
    json.dumps(ROW),
    '{"id": "broken", "task": ',  # not JSON
    json.dumps(S1),
    json.dumps(BAD_ROW),
    json.dumps(S1_BAD_MODEL),
    json.dumps(SPAN_ROW),
    "[1, 2, 3]",
    json.dumps({"id": "row-3", "task": "nope:x", "text": TEXT, "questions": [{"options": ["a", "b"]}]}),
    json.dumps({**ROW, "id": "row-4"}),
]


def run_predict(demo_dir, tmp_path, lines: list[str], *extra: str) -> list[dict]:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["predict", "--checkpoint", str(demo_dir), str(inp), "--out", str(out), *extra]) == 0
    return [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]


def assert_error_line(d: dict, rid: str, etype: str, *needles: str) -> None:
    assert d["status"] == "error" and d["id"] == rid
    assert set(d["error"]) == {"type", "message"} and d["error"]["type"] == etype
    for n in needles:
        assert n in d["error"]["message"], (n, d["error"]["message"])


def test_predict_file_mixed_lines(demo_dir, demo_model, tmp_path, capsys):
    out = run_predict(demo_dir, tmp_path, LINES, "--precision", "fp32")
    assert len(out) == len(LINES)
    assert [d["id"] for d in out] == [
        "row-1",
        "line-2",
        "req-1",
        "row-bad",
        "req-2",
        "row-2",
        out[6]["id"],
        "row-3",
        "row-4",
    ]
    assert [d["status"] for d in out] == ["ok", "error", "ok", "error", "error", "ok", "error", "error", "ok"]
    assert_error_line(out[1], "line-2", "invalid_request", "line 2", "not valid JSON")
    assert_error_line(out[3], "row-bad", "invalid_request", "questions[0]", "at least 2 options", "got 1")
    assert_error_line(out[4], "req-2", "model_mismatch", "vela2-9b", "vela2-demo")
    assert_error_line(out[6], out[6]["id"], "invalid_request", "JSON object")
    assert_error_line(out[7], "row-3", "invalid_request", "'nope'")
    # the ok lines carry exactly what predict() / system_one_request() give (same numbers)
    ref = vela2.predict(demo_model, [ROW, SPAN_ROW], precision="fp32")
    for d, r in ((out[0], ref[0]), (out[5], ref[1])):
        want = r.to_json_dict()
        assert d["task"] == want["task"]
        for a, b in zip(d["answers"], want["answers"], strict=True):
            assert a.keys() == b.keys() and a.get("decision") == b.get("decision")
            assert max(abs(a["probs"][k] - b["probs"][k]) for k in a["probs"]) <= 1e-5
    assert "units" not in out[5]["answers"][0]
    s1 = system_one_request(demo_model, S1, precision="fp32")
    assert out[2]["tasks"].keys() == s1["tasks"].keys()
    assert out[2]["tasks"]["intent"]["decision"] == s1["tasks"]["intent"]["decision"]
    assert out[2]["tasks"]["intent"]["probs"] == pytest.approx(s1["tasks"]["intent"]["probs"], abs=1e-5)


def test_a_line_nested_too_deeply_or_not_utf8_fails_alone(tmp_path):
    """5,000 levels of [ (valid JSON) raised RecursionError, and one byte that is not UTF-8 a
    UnicodeDecodeError (the file was read as UTF-8 text), out of `vela2 predict`: a traceback and no
    output. Each fails its own line now, the lines around it decoded as before."""
    from vela2.cli import read_jsonl

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"\n".join([json.dumps(ROW).encode(), b"[" * 5000 + b"]" * 5000, b'{"id": "x\xff"}',
                                 b'{"id": "s\\ud800"}', b"[" * 64 + b"]" * 64]) + b"\n")
    (first, _), deep, bad_byte, (surrogate, _), (shallow, _) = read_jsonl(str(inp))
    assert first == ROW
    assert deep[0] == {"id": "line-2"}
    assert str(deep[1]) == "line 2 is nested deeper than 64 levels"
    assert bad_byte[0] == {"id": "line-3"}
    assert str(bad_byte[1]).startswith("line 3 is not valid JSON: 'utf-8' codec can't decode byte 0xff")
    assert surrogate == {"id": "s\ud800"}  # decoded: predict() refuses it by name (lone surrogate)
    assert isinstance(shallow, list)  # 64 levels: within the limit


def test_predict_answers_around_a_deep_line_and_a_bad_byte(demo_dir, tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(b"\n".join([json.dumps(ROW).encode(), b"[" * 5000 + b"]" * 5000, b'{"id": "x\xff"}',
                                 json.dumps({**ROW, "id": "row-4"}).encode()]) + b"\n")
    assert main(["predict", "--checkpoint", str(demo_dir), str(inp), "--out", str(out), "--precision", "fp32"]) == 0
    got = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [d["id"] for d in got] == ["row-1", "line-2", "line-3", "row-4"]
    assert [d["status"] for d in got] == ["ok", "error", "error", "ok"]
    assert_error_line(got[1], "line-2", "invalid_request", "line 2 is nested deeper than 64 levels")
    assert_error_line(got[2], "line-3", "invalid_request", "line 3", "can't decode byte 0xff")
    assert "4 lines, 2 errors" in capsys.readouterr().err


def test_summary_on_stderr(demo_dir, tmp_path, capsys):
    run_predict(demo_dir, tmp_path, LINES, "--precision", "fp32")
    assert f"{len(LINES)} lines, 5 errors" in capsys.readouterr().err


def test_units_on_a_long_row(demo_dir, tmp_path):
    rng = random.Random(3)
    words = "the of and to company market report price bank city police court Alice Bob Acme".split()
    text = "Alice Smith " + " ".join(rng.choice(words) for _ in range(1500)) + " bob@globex.com"
    row = {"id": "long", "task": "span:pii_long", "text": text, "questions": [{"labels": ["person", "email"]}]}
    choice = {**ROW, "id": "plain"}
    out = run_predict(demo_dir, tmp_path, [json.dumps(row), json.dumps(choice)], "--units", "--precision", "fp32")
    assert [d["id"] for d in out] == ["long", "plain"]
    units = out[0]["answers"][0]["units"]
    offsets = units["offsets"]
    assert offsets == split_words(text).tolist()  # every word of the whole text, in order
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    assert all(a[1] <= b[0] for a, b in zip(offsets, offsets[1:], strict=False))
    assert set(units["probs"]) == {"person", "email"}
    assert all(len(v) == len(offsets) for v in units["probs"].values())
    assert all(0.0 <= p <= 1.0 for v in units["probs"].values() for p in v)
    for s in out[0]["answers"][0]["spans"]:
        assert text[s["start"] : s["end"]] == s["text"]
    assert "units" not in out[1]["answers"][0]  # choice answers have no word units


def test_units_flag_reaches_system_one_lines(demo_dir, tmp_path):
    """Found by review: --units was added to rows only, silently not to SystemOne requests."""
    from vela2.api.systemone import render_input

    out = run_predict(demo_dir, tmp_path, [json.dumps(S1)], "--units", "--precision", "fp32")
    tasks = out[0]["tasks"]
    assert tasks["pii"]["units"]["offsets"] == split_words(render_input(S1["input"])[0]).tolist()
    assert "units" not in tasks["intent"]


def test_units_on_the_row_without_the_flag(demo_dir, tmp_path):
    out = run_predict(
        demo_dir, tmp_path, [json.dumps({**SPAN_ROW, "units": True}), json.dumps(SPAN_ROW)], "--precision", "fp32"
    )
    assert "units" in out[0]["answers"][0] and "units" not in out[1]["answers"][0]


class KeptOpen(io.StringIO):
    """A stream that records a close() instead of closing (so its text can still be read)."""

    closed_by_caller = False

    def close(self) -> None:
        self.closed_by_caller = True


def test_stdin_stdout_and_bf16(demo_dir, monkeypatch):
    stdin = KeptOpen(json.dumps(ROW) + "\n" + json.dumps(SPAN_ROW) + "\n")
    stdout = KeptOpen()
    monkeypatch.setattr("sys.stdin", stdin)
    monkeypatch.setattr("sys.stdout", stdout)
    assert main(["predict", "--checkpoint", str(demo_dir), "-", "--device", "cpu"]) == 0  # bf16 default
    lines = stdout.getvalue().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["row-1", "row-2"]
    probs = json.loads(lines[0])["answers"][0]["probs"]
    assert sum(probs.values()) == pytest.approx(1.0) and np.isfinite(list(probs.values())).all()
    # main() is callable in-process: it must not close the process's stdout
    assert not stdout.closed_by_caller


def test_bad_checkpoint_and_missing_input(tmp_path, demo_dir, capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps(ROW) + "\n")
    assert main(["predict", "--checkpoint", str(tmp_path / "nope"), str(inp)]) == 2
    assert "config.json does not exist" in capsys.readouterr().err
    assert main(["predict", "--checkpoint", str(demo_dir), str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_the_packages_register_their_subcommands(capsys):
    from vela2.cli import plugins

    assert set(plugins()) == {"worker", "backfill", "jobs", "http", "status", "cells", "demo", "parity", "loadtest"}
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in ("init-demo", "predict", "calibrate", "worker", "backfill", "jobs", "http", "demo", "parity",
                 "loadtest"):
        assert name in out
    assert "unavailable" not in out


def test_a_plugin_parses_its_own_flags_and_reports_errors_as_the_cli_does(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["worker", "--max-wait-ms", "soon"])
    assert e.value.code == 2 and "--max-wait-ms must be a number; got 'soon'" in capsys.readouterr().err


def test_predict_defaults_to_the_workers_precision(demo_dir, demo_model, tmp_path):
    """One default on every path (vela2.config.default_precision): fp32 on a CPU for `vela2 predict`,
    vela2.predict() and the worker alike, bf16 on CUDA."""
    from vela2.cli import build_parser
    from vela2.config import default_precision

    assert (default_precision("cpu"), default_precision("cuda:0")) == ("fp32", "bf16")
    for command in ("predict", "calibrate"):
        assert build_parser().parse_args([command, "--checkpoint", "c", "f"]).precision is None
    def untimed(results: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "timings"} for r in results]

    lines = [json.dumps(ROW), json.dumps(SPAN_ROW), json.dumps(S1)]
    default = untimed(run_predict(demo_dir, tmp_path, lines))
    assert default == untimed(run_predict(demo_dir, tmp_path, lines, "--precision", "fp32"))
    assert default != untimed(run_predict(demo_dir, tmp_path, lines, "--precision", "bf16"))
    got = untimed([r.to_json_dict() for r in vela2.predict(demo_model, [ROW, SPAN_ROW])])
    assert got == untimed([r.to_json_dict() for r in vela2.predict(demo_model, [ROW, SPAN_ROW], precision="fp32")])




def test_version_and_every_help_names_its_defaults_never_a_secret(capsys, monkeypatch):
    from vela2 import __version__
    from vela2.cli import plugins

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"vela2 {__version__}"
    monkeypatch.setenv("VELA2_REDIS_URL", "redis://:hunter2@10.9.9.9:6379/0")  # defaults from the environment
    monkeypatch.setenv("VELA2_WEBHOOK_SECRET", "whsec_do-not-show-me")
    shown = {}
    for argv in [[name, "--help"] for name in sorted(plugins()) if name not in ("jobs", "cells")] + [
            ["jobs", "submit", "--help"], ["predict", "--help"], ["train", "--help"]]:  # (cells: no option has one)
        with pytest.raises(SystemExit) as e:
            main(argv)
        out = capsys.readouterr().out
        assert e.value.code == 0, argv
        assert "hunter2" not in out and "do-not-show-me" not in out, argv
        shown[" ".join(argv[:-1])] = out
    assert "(default: redis://:**@10.9.9.9:6379/0)" in " ".join(shown["status"].split())
    assert "--port PORT default: 8000" in " ".join(shown["http"].split())  # an option without help too
    assert "default 1.0" in " ".join(shown["worker"].split())  # --idle-wait-s, from the settings
    assert "default: cpu" in shown["predict"] and "default: cpu" in shown["train"]
    missing = [k for k, out in shown.items() if "default" not in out]
    assert missing == [], missing


def test_batch_invariant_flags_score_every_line_the_same_bits_in_any_order(demo_dir, tmp_path, capsys):
    """--batch-invariant on predict (and eval / calibrate, whose scoring takes the same mode): a file and
    the same file reversed give the same answers to the bit (the default mode's differ in the last bits)."""
    from vela2.train.synthetic import labelled_rows

    rows = [dict(r, logits=True) for r in labelled_rows(12, seed=5, bundled_share=1.0)]
    forward, backward = tmp_path / "f.jsonl", tmp_path / "b.jsonl"
    forward.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "gold"}) + "\n" for r in rows))
    backward.write_text("".join(reversed(forward.read_text().splitlines(keepends=True))))

    def answers(path, *flags: str) -> list[dict]:
        out = tmp_path / "out.jsonl"
        assert main(["predict", "--checkpoint", str(demo_dir), str(path), "--out", str(out), *flags]) == 0
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        return sorted(({k: v for k, v in d.items() if k != "timings"} for d in lines), key=lambda d: d["id"])

    assert answers(forward, "--batch-invariant") == answers(backward, "--batch-invariant")
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "--checkpoint", str(demo_dir), str(dev), "--batch-invariant"]) == 0
    assert main(["calibrate", "--checkpoint", str(demo_dir), str(dev), "--out", str(tmp_path / "cal.json"),
                 "--batch-invariant"]) == 0
    assert json.loads((tmp_path / "cal.json").read_text())
    capsys.readouterr()
