"""stack.parity's comparison: decision and span-set diffs counted between two answer sets."""

from __future__ import annotations

from stack.parity import compare, format_report


def test_compare_counts_decision_and_span_diffs():
    def res(decision, spans, p):
        return {"status": "ok", "answers": [
            {"task": "choice:x", "probs": {"a": p, "b": 1 - p}, "decision": decision, "logits": [p, 0.0, -1.0]},
            {"task": "span:pii", "probs": {"person": 0.9}, "spans": spans, "gate_fired": False,
             "units": {"offsets": [[0, 1]], "probs": {"person": [0.9]}, "logits": {"person": [2.2]}}}]}

    s1 = [{"label": "person", "start": 0, "end": 1}]
    left, right = [res("a", s1, 0.7)], [res("b", [], 0.4)]
    comps = {c.type: c for c in compare("x", left, right, same_precision=True)}
    assert comps["choice"].decision_diffs == 1 and abs(comps["choice"].max_abs_prob_diff - 0.3) < 1e-12
    assert comps["span"].span_set_diffs == 1 and comps["span"].spans == 1
    report = {"checkpoint": "c", "model": "m", "device": "cpu", "rows": 1, "row_counts": {"choice:x": 1},
              "rendering": {"rows": 1, "sequences": 1, "mismatches": 0, "parts": 0, "blocks": 0,
                            "word_positions": 0, "offsets": 0, "window_count": 0},
              "comparisons": [c.to_dict() for c in comps.values()],
              "bundled_vs_single": {"rows": 0, "by_task": {}, "questions": 0, "span_questions": 0,
                                    "bit_identical": 0, "max_abs_logit_diff": 0, "span_max_abs_logit_diff": 0,
                                    "noise_floor_max_abs_logit_diff": 0, "noise_floor_span_max_abs_logit_diff": 0,
                                    "decision_flips": 0},
              "bundle_precision": "fp32",
              "systemone": {"requests": 0, "tasks": 0, "max_abs_diff": 0, "decision_mismatches": 0, "ok": True,
                            "other_model_rejected": True},
              "times_s": {}, "ok": False, "verdict": "x: 1 decision diffs"}
    assert "1 span-set diffs" in format_report(report)


def test_the_verdict_holds_invariant_arms_to_the_bit_and_never_fails_on_the_noise_floor():
    from stack.parity import Comparison, verdict

    def report(*comparisons: Comparison, invariant: bool = True) -> dict:
        return {"batch_invariant": invariant, "rendering": {"mismatches": 0},
                "systemone": {"ok": True, "other_model_rejected": True},
                "comparisons": [c.to_dict() for c in comparisons]}

    last_bit = Comparison("worker_bf16_vs_predict_bf16", "choice", True, n=3, max_abs_logit_diff=2e-7)
    assert verdict(report(last_bit))[0] is False  # invariant arms: a last-bit difference is a failure
    assert "max |logit diff| 2e-07" in verdict(report(last_bit))[1]
    assert verdict(report(last_bit, invariant=False))[0] is True  # default mode: decisions only
    flips = Comparison("noise_floor_bf16_batched_vs_alone", "choice", True, n=3, max_abs_logit_diff=0.1,
                       decision_diffs=2, noise_floor=True)
    ok, why = verdict(report(flips))
    assert ok and why == "same-precision arms are the same bits; renders identical"
    precisions = Comparison("predict_fp8_vs_predict_bf16", "choice", False, n=3, decision_diffs=1)
    assert verdict(report(precisions))[0] is True  # what a precision changes is reported, not failed
