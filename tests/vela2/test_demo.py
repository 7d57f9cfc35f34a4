"""The demo checkpoint: deterministic, named, and with heads whose outputs are spread out on ordinary
text (so every decode path has work to do)."""

from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.torch import load_file

import vela2
from vela2.checkpoint import WEIGHTS
from vela2.cli import main
from vela2.demo import DEMO_NAME, sample_rows

ORDINARY = [
    "The weather in the city was cold and wet all week, and the school closed early on Friday.",
    "Our customer support team answered the refund question within two hours. Great service!",
    "The bank raised its price for card payments, and the market report says people are not happy.",
    "Please call Maria Lopez at +1-555-0199 or write to maria.lopez@example.org before Monday.",
    "I think the film was too long, but the music was very good and the actors were great.",
]


def test_config_carries_a_name(demo_dir, demo_model):
    cfg = json.loads((demo_dir / "config.json").read_text())
    assert cfg["name"] == DEMO_NAME == "vela2-demo" == demo_model.name
    assert cfg["model_type"] == "vela2" and cfg["backbone"]["model_type"] == "qwen2"
    assert {"max_window_tokens", "window_overlap_words", "heads", "special_tokens"} <= set(cfg)


def test_init_demo_is_deterministic(demo_dir, tmp_path, capsys):
    """A second write (through `vela2 init-demo`) gives identical files and tensors."""
    assert main(["init-demo", str(tmp_path / "again")]) == 0
    assert "demo checkpoint written to" in capsys.readouterr().out
    again = tmp_path / "again"
    for name in ("tokenizer.json", "config.json", "calibration.json"):
        assert (again / name).read_bytes() == (demo_dir / name).read_bytes(), name
    a, b = load_file(str(demo_dir / WEIGHTS)), load_file(str(again / WEIGHTS))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_outputs_spread_out_on_ordinary_text(demo_model):
    rows = []
    for i, text in enumerate(ORDINARY):
        rows.append(
            {
                "id": f"c{i}",
                "task": "choice:x",
                "text": text,
                "logits": True,
                "questions": [
                    {"question": "Is the text positive?", "options": ["yes", "no"]},
                    {"question": "What is the topic?", "options": ["weather", "finance", "support", "film"]},
                ],
            }
        )
        rows.append(
            {
                "id": f"s{i}",
                "task": "span:ents",
                "text": text,
                "units": True,
                "questions": [{"labels": ["person", "email", "phone", "company"]}],
            }
        )
    res = vela2.predict(demo_model, rows, precision="fp32")
    opt = np.concatenate([a.logits for r in res for a in r.answers if a.logits is not None])
    assert opt.std() >= 1.0
    units = np.concatenate([v for r in res for a in r.answers if a.units for v in a.units.probs.values()])
    assert (units > 0.5).any() and (units < 0.5).any()
    assert any(a.spans for r in res for a in r.answers if a.units)


def test_sample_rows_all_answer(demo_model):
    rows = sample_rows()
    assert {r["task"].split(":")[0] for r in rows} == {"choice", "score", "set", "span"}
    for precision in ("fp32", "bf16"):
        res = vela2.predict(demo_model, rows, precision=precision)
        assert [r.id for r in res] == [r["id"] for r in rows]
        assert all(r.status == "ok" for r in res)
    long_row = next(r for r in rows if r["id"] == "demo-long")
    assert len(vela2.pipeline.prepare(demo_model, long_row).sequences) > 1  # exercises windows
