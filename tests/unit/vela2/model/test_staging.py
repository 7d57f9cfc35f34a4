"""vela2.model.staging: the pinned buffer pool's reuse policy (plain host tensors stand in for pinned ones:
this machine has no CUDA) and the CPU path of to_device."""

import numpy as np
import torch

from vela2.model import staging


class HostPool(staging.PinnedPool):
    def _allocate(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)


class Event:
    def __init__(self, done: bool):
        self.done = done

    def query(self) -> bool:
        return self.done


def test_a_given_back_buffer_is_reused_and_sizes_round_up_to_a_power_of_two():
    pool = HostPool()
    a = pool.take(3 << 20)
    assert a.numel() == 4 << 20 and pool.allocations == 1
    pool.give(a)
    assert pool.take(1 << 20) is a  # any free buffer that fits: no new allocation
    assert pool.allocations == 1
    assert pool.take(10).numel() == staging.MIN_BYTES and pool.allocations == 2


def test_the_smallest_fitting_buffer_goes_first():
    pool = HostPool()
    big, small = pool.take(8 << 20), pool.take(2 << 20)
    pool.give(big)
    pool.give(small)
    assert pool.take(1 << 20) is small
    assert pool.take(1 << 20) is big


def test_a_buffer_whose_copy_is_still_queued_is_not_handed_out():
    pool = HostPool()
    buf = pool.take(1 << 20)
    event = Event(done=False)
    pool.give(buf, event)
    other = pool.take(1 << 20)
    assert other is not buf and pool.allocations == 2
    event.done = True
    assert pool.take(1 << 20) is buf


def test_at_most_keep_buffers_stay_free_the_smallest_leaving_first():
    pool = HostPool()
    bufs = [pool.take((k + 1) << 20) for k in range(staging.KEEP + 2)]
    for b in bufs:
        pool.give(b)
    kept = sorted(b.numel() for b, _ in pool._free)
    assert len(kept) == staging.KEEP
    assert kept[0] > bufs[1].numel()  # the two smallest went


def test_to_device_on_a_cpu_makes_int64_tensors_of_the_arrays():
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.zeros((0, 2), dtype=np.int64)
    ta, tb = staging.to_device([a, b], torch.device("cpu"))
    assert ta.dtype == torch.int64 and ta.tolist() == a.tolist()
    assert tuple(tb.shape) == (0, 2)
