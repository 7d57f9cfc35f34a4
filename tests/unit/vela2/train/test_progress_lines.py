"""The long model commands report progress on a stderr that is no terminal (what make and CI show):
`vela2 init-demo`, `train` (and the calibration it fits), `calibrate`, `eval` and `import` each write a
first line, then whole lines (no bar), and a last line `done in`; stdout keeps only their output.
Tiny inputs, so that each runs in seconds."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from bench.import_rss import make_hf_dir
from vela2.cli import main
from vela2.train import demo_model
from vela2.train.evaluate import eval_report
from vela2.train.synthetic import labelled_rows

TINY = demo_model.DemoRecipe(n_train=12, n_dev=12, epochs=1, warmup_rows=8)  # the demo's code path, in seconds


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def assert_reported(err: str, label: str, unit: str) -> list[str]:
    """`err` holds `label`'s progress as plain lines, in one run or several (the demo trains a warm-up
    first): each run's first line at 0, its last at its total, done. Returns the last run's lines."""
    assert "\r" not in err, err  # no bar off a terminal
    lines = [line for line in err.splitlines() if line.startswith(f"{label}: ")]
    starts = [i for i, line in enumerate(lines) if re.fullmatch(rf"{label}: {unit} 0/[\d,]+ \(0%\), 0 s elapsed", line)]
    assert starts and starts[0] == 0, lines
    for begin, end in zip(starts, [*starts[1:], len(lines)], strict=True):
        run = lines[begin:end]
        assert len(run) >= 2, lines
        total = re.fullmatch(rf"{label}: {unit} 0/([\d,]+) .*", run[0]).group(1)  # type: ignore[union-attr]
        assert run[-1].startswith(f"{label}: {unit} {total}/{total} (100%), ") and "done in" in run[-1], run
    return lines[starts[-1]:]


def test_train_reports_its_steps_and_the_calibration_its_rows(untrained_demo_dir, tmp_path, capsys):
    train = _write(tmp_path / "train.jsonl", labelled_rows(12, seed=21))
    dev = _write(tmp_path / "dev.jsonl", labelled_rows(6, seed=22))
    assert main(["train", "--checkpoint", str(untrained_demo_dir), str(train), "--dev", str(dev),
                 "--out", str(tmp_path / "out"), "--epochs", "2"]) == 0
    out, err = capsys.readouterr()
    steps = assert_reported(err, "train", "step")
    assert "epoch 2/2" in steps[-1] and "loss " in steps[-1]
    assert_reported(err, "calibrate", "row")
    assert "train: " not in out and "calibrate: " not in out and "wrote" in out  # stdout: the report alone


def test_init_demo_reports_training_and_calibration(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(demo_model, "RECIPE", TINY)
    assert main(["init-demo", str(tmp_path / "demo")]) == 0
    out, err = capsys.readouterr()
    assert_reported(err, "train", "step")
    assert_reported(err, "calibrate", "row")
    assert "demo checkpoint written to" in out


def test_calibrate_and_eval_report_the_rows_they_score(untrained_demo_dir, tmp_path, capsys):
    ckpt = Path(shutil.copytree(untrained_demo_dir, tmp_path / "ckpt"))
    rows = _write(tmp_path / "rows.jsonl", labelled_rows(5, seed=23))
    assert main(["calibrate", "--checkpoint", str(ckpt), str(rows)]) == 0
    assert_reported(capsys.readouterr().err, "calibrate", "row")
    assert main(["eval", "--checkpoint", str(ckpt), str(rows)]) == 0
    out, err = capsys.readouterr()
    assert_reported(err, "eval", "row")
    assert "eval:" not in out and out.strip()


def test_import_reports_the_tensors_it_converts(tmp_path, capsys):
    hf = make_hf_dir(tmp_path / "hf", "qwen2", max_shard_size="1GB")
    capsys.readouterr()  # transformers' own bar while it wrote the directory
    assert main(["import", str(hf), str(tmp_path / "ckpt"), "--name", "tiny"]) == 0
    assert_reported(capsys.readouterr().err, "import", "tensor")


def test_the_library_functions_stay_quiet_unless_asked(untrained_demo_dir, capsys):
    import vela2

    model = vela2.load(untrained_demo_dir)
    rows = labelled_rows(3, seed=24)
    eval_report(model, rows)
    assert capsys.readouterr().err == ""
    eval_report(model, rows, progress=None)
    assert_reported(capsys.readouterr().err, "eval", "row")
