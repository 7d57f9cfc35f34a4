"""vela2.train.synthetic: valid rows with character-exact gold, deterministic, and held-out rows made only of
families, names and formats no training row has (what makes the demo's held-out scores honest)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from vela2.api.schemas import parse_row
from vela2.text.rendering import split_words
from vela2.train import synthetic
from vela2.train import synthetic_templates as tpl
from vela2.train.demo_model import HELD_OUT_ROWS, HELD_OUT_SEED
from vela2.train.labelled import check_gold
from vela2.train.synthetic import (
    LONGEST_MESSAGE_WORDS,
    QUESTIONS,
    SPAN_LABELS,
    labelled_rows,
    labelled_rows_with_families,
    texts,
)

TRAIN = labelled_rows_with_families(1500, seed=5, bundled_share=1.0, vary_questions=True)
HELD = labelled_rows_with_families(HELD_OUT_ROWS, seed=HELD_OUT_SEED, bundled_share=1.0, split="held_out")


def _family_names(pairs) -> set[str]:
    return {f"{kind}:{family}" for _, fams in pairs for kind, family in fams.items()}


@pytest.mark.parametrize("split", synthetic.SPLITS)
def test_rows_are_valid_and_their_gold_fits(split):
    rows = labelled_rows(300, seed=1, split=split) + labelled_rows(300, seed=2, bundled_share=1.0, split=split,
                                                                    vary_questions=True)
    for obj in rows:
        row = parse_row(obj)
        assert check_gold(row, obj["gold"]) is None, obj
        golds = obj["gold"] if len(row.questions) > 1 else [obj["gold"]]
        for q, gold in zip(obj["questions"], golds, strict=True):
            if "labels" in q:  # spans: character-exact, of the question's labels
                assert all(s["label"] in q["labels"] and obj["text"][s["start"]:s["end"]].strip() for s in gold)
            elif isinstance(gold, list):
                assert set(gold) <= set(q["options"])
            else:
                assert gold in q["options"]
    assert {r["task"] for r in rows} == set(QUESTIONS)  # single rows ask every task in turn


def test_the_same_seed_gives_the_same_rows_and_splits_differ():
    assert labelled_rows(50, seed=3) == labelled_rows(50, seed=3)
    assert labelled_rows(50, seed=3) != labelled_rows(50, seed=4)
    train, held = labelled_rows(50, seed=3), labelled_rows(50, seed=3, split="held_out")
    assert not {r["text"] for r in train} & {r["text"] for r in held}
    with pytest.raises(ValueError, match="split must be one of"):
        labelled_rows(1, seed=3, split="test")


def test_held_out_rows_use_held_out_families_only_and_training_rows_none():
    held, train = _family_names(HELD), _family_names(TRAIN)
    assert held <= tpl.HELD_OUT
    assert not train & tpl.HELD_OUT
    # every held-out family is in the evaluation the demo writes (so each gets a score)
    assert held == tpl.HELD_OUT
    counts = Counter(f"{k}:{v}" for _, fams in HELD for k, v in fams.items())
    assert min(counts.values()) >= 15, counts.most_common()[-5:]


def test_held_out_names_companies_and_domains_are_unseen():
    for pool in (tpl.FIRST_NAMES, tpl.LAST_NAMES, tpl.COMPANIES, tpl.MAIL_HOSTS, tpl.CITIES, tpl.PRODUCTS):
        assert not set(pool["train"]) & set(pool["held_out"])
    train_text = " ".join(r["text"] for r, _ in TRAIN)
    for name in tpl.FIRST_NAMES["held_out"] + tpl.LAST_NAMES["held_out"] + tpl.COMPANIES["held_out"]:
        assert name not in train_text, name


def test_training_data_varies_formats_and_lengths():
    spans = [(s["label"], r["text"][s["start"]:s["end"]]) for r, _ in TRAIN for s in r["gold"][0]]
    emails = {t for label, t in spans if label == "email"}
    phones = {t for label, t in spans if label == "phone"}
    assert any("+" in e.split("@")[0] for e in emails) and any(e.count(".") >= 3 for e in emails)
    assert len({e.rsplit(".", 1)[1] for e in emails}) >= 20  # top-level domains
    assert {"(", "-", ".", "/", " "} <= {c for p in phones for c in p}
    assert any(len(t.split()) >= 3 for label, t in spans if label == "person")
    lengths = [len(split_words(r["text"])) for r, _ in TRAIN]
    assert min(lengths) <= 8 and max(lengths) <= LONGEST_MESSAGE_WORDS
    assert max(lengths) >= LONGEST_MESSAGE_WORDS * 0.6


def test_varied_questions_keep_their_gold_among_the_options():
    rows = [r for r, _ in TRAIN]
    asked = [q for r in rows for q in r["questions"]]
    assert any("question" not in q for q in asked)  # the kind's default text
    assert any(q.get("labels") not in (None, SPAN_LABELS) for q in asked)  # a subset of the span labels
    assert any(q.get("options") not in (None, *(v.get("options") for v in QUESTIONS.values())) for q in asked)


def test_texts_without_spans_hold_no_name_address_or_number():
    cut = " ".join(texts(200, seed=9, without_spans=True))
    assert not re.search(r"\S@\S+\.[a-z]", cut) and not re.search(r"\+\d", cut)  # no e-mail address, no phone
    for name in tpl.FIRST_NAMES["train"] + tpl.CITIES["train"]:
        assert f" {name} " not in cut, name


def test_training_frames_and_words_are_not_the_held_out_ones():
    """Training families say a request or a mood in other frames than held-out ones, and the words only
    training frames take (WANT_MORE, MORE_ADJECTIVES, MORE_FEELINGS) never fill a held-out frame; the
    mood families are generated from frames x words (SENTIMENTS), as the request frames are (INTENTS)."""
    assert not set(tpl.WANT_FRAMES) & set(tpl.WANT_FRAMES_NEW)
    assert not set(tpl.ADJ_FRAMES) & set(tpl.ADJ_FRAMES_NEW)
    assert not set(tpl.FEEL_FRAMES) & set(tpl.FEEL_FRAMES_NEW)
    for intent, wants in tpl.WANT_MORE.items():
        held = " ".join(tpl.INTENTS[intent]["frames-new"])
        assert not set(wants) & set(tpl.WANT[intent]) and all(w.split("{")[0] not in held for w in wants)
    for sentiment in ("positive", "negative"):
        families = tpl.SENTIMENTS[sentiment]
        assert families["adj-new"] == tpl._mood(tpl.ADJ_FRAMES_NEW, tpl.ADJECTIVES[sentiment], "adj")
        assert families["feel-new"] == tpl._mood(tpl.FEEL_FRAMES_NEW, tpl.FEELINGS[sentiment], "feel")
        extra = {*tpl.MORE_ADJECTIVES[sentiment], *tpl.MORE_FEELINGS[sentiment]}
        assert not extra & {*tpl.ADJECTIVES[sentiment], *tpl.FEELINGS[sentiment]}
        for family in ("adj-new", "feel-new"):
            assert not any(re.search(rf"\b{w}\b", s) for s in families[family] for w in extra), family
