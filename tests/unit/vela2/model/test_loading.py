"""Reading safetensors into parameters (vela2.model.loading): the same tensors as safetensors' own
reader, cast as the parameter holds them, through staging buffers smaller than a tensor and several
threads; malformed files refused before their weights are read."""

from __future__ import annotations

import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from vela2.errors import CheckpointError
from vela2.model import loading


def _stored(tmp_path):
    torch.manual_seed(0)
    tensors = {
        "a.weight": torch.randn(37, 29).to(torch.bfloat16),
        "b.weight": torch.randn(300, 7).to(torch.bfloat16),
        "c.bias": torch.randn(11),
        "d.scale": torch.randn(()),
        "e.empty": torch.zeros(0, 4),
    }
    save_file({k: v for k, v in tensors.items() if k < "c"}, str(tmp_path / "one.safetensors"))
    save_file({k: v for k, v in tensors.items() if k >= "c"}, str(tmp_path / "two.safetensors"))
    files = {k: tmp_path / ("one.safetensors" if k < "c" else "two.safetensors") for k in tensors}
    return tensors, files


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_bytes,threads", [(64 << 20, 8), (100, 3), (7, 1)])
def test_read_into_gives_the_stored_tensors_cast_as_the_parameters_hold_them(tmp_path, dtype, chunk_bytes, threads):
    tensors, files = _stored(tmp_path)
    params = {k: torch.full(v.shape, float("nan"), dtype=dtype) for k, v in tensors.items()}
    seen = []
    n = loading.read_into(params, files, threads=threads, chunk_bytes=chunk_bytes,
                          progress=lambda done, total: seen.append((done, total)))
    assert n == sum(v.numel() * v.element_size() for v in tensors.values())
    assert seen[-1] == (n, n) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    reference = {**load_file(str(tmp_path / "one.safetensors")), **load_file(str(tmp_path / "two.safetensors"))}
    for k, v in reference.items():
        assert params[k].dtype == dtype and torch.equal(params[k], v.to(dtype)), k


def test_parameters_that_require_grad_are_filled_in_place(tmp_path):
    tensors, files = _stored(tmp_path)
    params = {k: torch.nn.Parameter(torch.zeros(v.shape)) for k, v in tensors.items()}
    before = {k: p.data_ptr() for k, p in params.items()}
    loading.read_into(params, files)
    assert {k: p.data_ptr() for k, p in params.items()} == before
    assert torch.equal(params["a.weight"].detach(), tensors["a.weight"].float())


def test_a_truncated_file_or_a_shape_mismatch_is_refused(tmp_path):
    tensors, files = _stored(tmp_path)
    params = {k: torch.zeros(v.shape) for k, v in tensors.items()}
    wrong = {**params, "b.weight": torch.zeros(7, 300)}
    with pytest.raises(CheckpointError, match=r"b.weight: stored shape \(300, 7\); config expects \(7, 300\)"):
        loading.read_into(wrong, files)
    one = tmp_path / "one.safetensors"
    one.write_bytes(one.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"b.weight ends at byte .*past the file's"):
        loading.read_into(params, files)
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(CheckpointError, match="malformed safetensors header"):
        loading.read_into({"x": torch.zeros(1)}, {"x": tmp_path / "bad.safetensors"})
    with pytest.raises(CheckpointError, match="does not hold it"):
        loading.read_into({"zz": torch.zeros(1)}, {"zz": tmp_path / "two.safetensors"})
