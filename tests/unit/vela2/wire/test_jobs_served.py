"""The identity a bulk job counts an ok answer under (vela2.wire.jobs.served_label), and the counts read
back from a job hash's fields."""

from __future__ import annotations

from vela2.wire.jobs import SERVED_PREFIX, served_counts, served_label

DIGEST = "e5d25348c955bdc21165da01f03000b1"


def test_an_answers_identity_is_its_model_digest_precision_and_mode():
    served = {"name": "vela2-demo", "digest": DIGEST, "precision": "bf16", "batch_invariant": False}
    assert served_label(served) == "vela2-demo e5d25348c955 bf16"
    # answers of the two modes may differ in their last bits: a job keeps them apart
    assert served_label({**served, "batch_invariant": True}) == "vela2-demo e5d25348c955 bf16 batch-invariant"
    assert served_label({"name": "m", "precision": "fp32"}) == "m - fp32"  # a model built in memory, older answers
    assert served_label(None) == "" and served_label({"digest": DIGEST}) == ""


def test_served_counts_reads_the_job_hash_fields():
    fields = {f"{SERVED_PREFIX}m a bf16".encode(): b"3", f"{SERVED_PREFIX}m a bf16 batch-invariant": "2",
              b"status": b"running"}
    assert served_counts(fields) == {"m a bf16": 3, "m a bf16 batch-invariant": 2}


def test_an_answer_stored_before_the_mode_was_named_reads_as_the_default_mode():
    from vela2.api.schemas import RowResult

    old = {"id": "r", "task": "choice:x", "status": "ok", "answers": [],
           "served_by": {"name": "vela2-demo", "digest": DIGEST, "precision": "fp32"}}
    assert RowResult.model_validate(old).served_by.batch_invariant is False
    assert served_label(old["served_by"]) == "vela2-demo e5d25348c955 fp32"
