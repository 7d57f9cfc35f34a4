"""The fused decoder under flex attention (torch.compile: a C++ compiler process on a CPU) equals it
under sdpa."""

from __future__ import annotations

# fused_on_this_cpu: an autouse fixture, which applies here too once imported
from tests.unit.vela2.model.test_fused import batch, encode, fused_on_this_cpu, tiny  # noqa: F401


def test_fused_flex_equals_sdpa():
    model = tiny(seed=4)
    ids, pos, parts, segs = batch(model)
    real = parts >= 0
    sdpa = encode(model, ids, pos, parts, segs, "fp32")
    flex = encode(model.set_attention("flex"), ids, pos, parts, segs, "fp32")
    assert (flex - sdpa)[real].abs().max() <= 1e-5 * sdpa[real].abs().max()


# --- fp8 -----------------------------------------------------------------------------------------------


# --- CUDA-graph padding ----------------------------------------------------------------------------------


