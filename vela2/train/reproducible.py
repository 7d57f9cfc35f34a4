"""The same demo weights on any x86-64 CPU: the kernels a CPU build runs, pinned.

Training sums in float32, and a sum's bits depend on its order, which depends on the kernel: ATen's
vectorised kernels (AVX2 or AVX-512, chosen by the CPU), MKL's GEMM code branch and oneDNN's ISA.
Over a thousand training steps a last-bit difference grows into another model (seen: the same
recipe trained on two machines of this project answered the docs' example request differently and
scored other held-out figures). Pinned to the AVX2 branch of all three, which every x86-64 CPU of the last ten years
runs, the build is the same bits wherever it runs (MKL's conditional numerical reproducibility
promises it for its branch; ATen's AVX2 kernels are the same code on any such CPU). It costs nothing
measurable on this project's 2-core AVX2 machines, but it is not what they choose by themselves: an
unpinned build there differs from a pinned one (which of the three settings makes the difference on
their AMD CPUs was not looked into).

The settings are read when the libraries start, so they must be in the environment before torch is
imported: `vela2.train.demo_model.init_demo` trains in a child process with them when its own
process lacks them, and the test suite sets them before it imports torch.
"""

from __future__ import annotations

import os
import platform

PINNED: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's dispatch (torch.backends.cpu.get_cpu_capability())
    "MKL_CBWR": "AVX2",  # MKL's conditional numerical reproducibility branch
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's kernels
}
X86 = ("x86_64", "amd64")


def pinned_settings() -> dict[str, str]:
    """The settings that pin the kernels on this machine: PINNED on x86-64, none elsewhere (an arm64
    build is its own; the settings name x86 ISAs)."""
    return dict(PINNED) if platform.machine().lower() in X86 else {}


def is_pinned(environ: dict[str, str] | None = None) -> bool:
    """Whether `environ` (os.environ by default) carries every pinned setting."""
    env = os.environ if environ is None else environ
    return all(env.get(k) == v for k, v in pinned_settings().items())


def pin() -> None:
    """Put the pinned settings in this process's environment (before torch is imported, or they do
    nothing to it; child processes inherit them either way)."""
    os.environ.update(pinned_settings())
