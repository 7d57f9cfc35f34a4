"""bench.workload: the seed's counts and bundles, determinism, copies, lengths and gold spans; the
summary, the batch plans and the MFU arithmetic of bench.gpu_engine, the kernel classes of
bench.gpu_profile."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # bench/ is not an installed package; run from the repository
    sys.path.insert(0, str(ROOT))

from bench import workload as wl  # noqa: E402
from vela2.api.schemas import parse_row  # noqa: E402

SEED_ROWS = 230
ROWS_PER_COPY = SEED_ROWS + wl.CONSTRUCTED_COUNT


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return wl.make_workload(seed=0, copies=1, gold=True)


def test_counts_per_task_equal_the_seed(rows):
    assert sum(wl.SEED_COUNTS.values()) == SEED_ROWS
    counts = Counter(wl.group_of(r) for r in rows)
    assert counts == Counter({**wl.SEED_COUNTS, wl.CONSTRUCTED: 10})
    dev = wl.make_workload(seed=0, constructed=False)
    assert Counter(r["task"] for r in dev) == Counter(wl.SEED_COUNTS)


def test_bundles_as_in_the_seed(rows):
    bundled = [r for r in rows if wl.is_bundle(r)]
    assert Counter(wl.group_of(r) for r in bundled) == Counter(wl.BUNDLED_COUNTS)
    assert len(bundled) == 60
    kinds = Counter()
    for r in bundled:
        for k, q in enumerate(r["questions"]):
            task = q.get("task") or r["task"]
            kinds["span" if task.startswith("span:") else "option"] += 1
            assert parse_row(r).question_task(k) == task
    assert kinds == {"option": 251, "span": 10}  # the seed's 251 choice / score / set and 10 span blocks


def test_constructed_rows_carry_a_task_per_block(rows):
    constructed = [r for r in rows if wl.group_of(r) == wl.CONSTRUCTED]
    assert len(constructed) == 10
    for r in constructed:
        assert r["task"] == wl.CONSTRUCTED_TASK
        tasks = [q["task"] for q in r["questions"]]
        assert tasks[0] == "choice:domain_dev" and tasks[-1] == "span:pii_dev"
        assert [t.split(":")[0] for t in tasks[1:5]] == ["score", "score", "set", "set"]
        assert r["questions"][-1]["labels"] and "options" not in r["questions"][-1]


def test_every_row_parses_and_ids_are_unique(rows):
    ids = [parse_row(r).id for r in rows]
    assert len(set(ids)) == len(ids) == ROWS_PER_COPY
    assert all(re.fullmatch(r".+-\d+-c0", i) for i in ids)


def test_same_seed_same_rows_other_seed_other_texts():
    a, b = wl.make_workload(seed=3), wl.make_workload(seed=3)
    assert a == b
    c = wl.make_workload(seed=4)
    assert [r["id"] for r in a] != [r["id"] for r in c]  # other arrival order
    by_id = {r["id"]: r["text"] for r in c}
    assert sum(r["text"] != by_id[r["id"]] for r in a) > 0.9 * len(a)


def test_copies_scale_and_start_with_copy_zero():
    one = wl.make_workload(seed=0, copies=1)
    three = wl.make_workload(seed=0, copies=3)
    assert len(three) == 3 * len(one)
    assert three[: len(one)] == one
    assert len({r["id"] for r in three}) == len(three)
    for c in range(3):
        part = three[c * len(one) : (c + 1) * len(one)]
        assert {r["id"].rsplit("-c", 1)[1] for r in part} == {str(c)}
        assert Counter(wl.group_of(r) for r in part) == Counter(wl.COUNTS)
    texts = {r["id"].rsplit("-c", 1)[0]: r["text"] for r in one}
    fresh = [r for r in three[len(one) : 2 * len(one)] if r["text"] != texts[r["id"].rsplit("-c", 1)[0]]]
    assert len(fresh) > 0.9 * len(one)  # copies are fresh texts, not repeats
    with pytest.raises(ValueError, match="copies"):
        wl.make_workload(copies=0)


def test_lengths_follow_the_documented_ranges(rows):
    for r in rows:
        lo, hi = wl.WORDS[wl.group_of(r)]
        n = wl.count_words(r["text"])
        assert lo <= n <= hi + 40, (r["id"], n, lo, hi)  # a text ends at the sentence past its target
    long4 = [wl.count_words(r["text"]) for r in rows if r["task"] == "span:pii_longdev_4096"]
    long8 = [wl.count_words(r["text"]) for r in rows if r["task"] == "span:pii_longdev_8192"]
    assert len(long4) == 4 and all(3891 <= n <= 4136 for n in long4)
    assert len(long8) == 3 and all(7782 <= n <= 8232 for n in long8)


def test_gold_spans_point_at_fitting_text(rows):
    seen = Counter()
    for r in rows:
        if r["task"] != "span:pii_dev":
            continue
        labels = set(r["questions"][0]["labels"])
        for g in r["gold"]:
            span = r["text"][g["start"] : g["end"]]
            assert g["label"] in labels and span == span.strip() and span
            seen[g["label"]] += 1
            if g["label"] == "email":
                assert re.fullmatch(r"[a-z0-9.]+@[a-z0-9.]+", span), span
            elif g["label"] == "phone":
                assert sum(ch.isdigit() for ch in span) >= 10, span
            elif g["label"] == "person":
                assert re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", span), span
    assert {"person", "email", "phone", "address", "organization", "date"} <= set(seen)
    ty = [r for r in rows if r["task"] == "span:tydiqa_goldp"]
    for r in ty:
        (g,) = r["gold"]
        assert re.fullmatch(r"[A-Z][a-z]+ \d+, \d{4}", r["text"][g["start"] : g["end"]])


def test_split_bundles_asks_each_question_alone(rows):
    bundled = [r for r in rows if wl.is_bundle(r)]
    single = wl.split_bundles(bundled)
    assert len(single) == sum(len(r["questions"]) for r in bundled) == 261
    by_id = {r["id"]: r for r in bundled}
    for s in single:
        row = parse_row(s)
        assert len(row.questions) == 1 and row.questions[0].task is None
        parent_id, k = s["id"].rsplit("/q", 1)
        parent = by_id[parent_id]
        q = parent["questions"][int(k)]
        assert s["task"] == (q.get("task") or parent["task"])
        assert s["text"] == parent["text"]
        assert "gold" not in s
    assert len({s["id"] for s in single}) == len(single)
    plain = [r for r in rows if not wl.is_bundle(r)]
    assert wl.split_bundles(plain) == plain


def test_summary_and_cli(tmp_path, capsys):
    out = tmp_path / "w.jsonl"
    assert wl.main(["--copies", "2", "--seed", "5", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 2 * ROWS_PER_COPY
    assert [json.loads(x) for x in lines] == wl.make_workload(seed=5, copies=2)
    printed = capsys.readouterr().out
    assert "span:pii_longdev_8192" in printed and f"wrote {2 * ROWS_PER_COPY:,} rows" in printed
    s = wl.summary(wl.make_workload(seed=5))
    assert s["rows"] == ROWS_PER_COPY and s["bundled_rows"] == 60 and s["questions"] == 441
    assert s["groups"]["set:shield"]["rows"] == 40 and s["groups"]["set:shield"]["bundled_rows"] == 26


# --- bench.gpu_engine ----------------------------------------------------------------------------


def test_batch_plans_and_mfu_arithmetic():
    from bench import gpu_engine as ge

    assert ge.fixed_batches(70, 32) == [list(range(32)), list(range(32, 64)), list(range(64, 70))]
    lengths = [10, 30, 20, 5]
    batches = [[0, 1], [2, 3]]
    assert ge.padded_cost(lengths, batches) == 30 * 2 + 20 * 2
    # rows of 30 tokens, first-fit decreasing: [30], [20, 10], [5] -> 3 rows x 30
    assert ge.batch_padded(lengths, [0, 1, 2, 3], row_tokens=30) == 90
    st = ge.arm_stats("x", lengths, batches, {"seconds": 2.0, "peak_memory_gib": None},
                      non_embedding=1000, peak_flops=1e6)
    assert st["real_tokens"] == 65 and st["padded_tokens"] == 100
    assert st["padding_fraction"] == pytest.approx(0.35)
    assert st["mfu_real_tokens"] == pytest.approx(2 * 1000 * 65 / 2.0 / 1e6)
    assert st["real_tokens_per_s"] == pytest.approx(32.5)


# --- bench.gpu_profile -----------------------------------------------------------------------------


def test_gpu_profile_classes_and_idle():
    from bench.gpu_profile import breakdown, kernel_class

    assert kernel_class("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN") == "gemm"
    assert kernel_class("nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT") == "gemm"
    assert kernel_class("fmha_cutlassF_bf16_aligned_64x64_rf_sm80") == "attention"
    assert kernel_class("triton_tem_fused_flex_attention_0") == "attention"
    # inductor names a kernel after every op it fused; a quantisation feeding _scaled_mm is elementwise
    assert kernel_class("triton_red_fused__scaled_mm__to_copy_abs_amax_clamp_div_t_0") == "elementwise"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<8, silu_kernel>") == "elementwise"
    # two overlapping kernels then a 5 us gap: 25 us span, 20 us busy
    ms = breakdown([("nvjet_a", 0.0, 10.0), ("triton_poi_fused_add_0", 5.0, 15.0), ("fmha_x", 20.0, 25.0)])
    assert ms["gemm"] == pytest.approx(0.010) and ms["elementwise"] == pytest.approx(0.010)
    assert ms["attention"] == pytest.approx(0.005) and ms["idle"] == pytest.approx(0.005)
    assert ms["span"] == pytest.approx(0.025)
