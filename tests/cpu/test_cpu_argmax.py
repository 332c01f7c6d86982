"""`domino_sglang.cpu.argmax` equals torch.argmax index for index: ties, NaN, -inf, shapes."""

from __future__ import annotations

import pytest
import torch

from domino_sglang.cpu.argmax import BLOCK, argmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 49152), (7, 8192), (3, 5, 49152), (2, 0, 1024)])
def test_random_rows_equal_torch(shape, dtype):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    got = argmax(x)
    assert got.dtype == torch.int64 and got.shape == shape[:-1]
    assert torch.equal(got, x.argmax(dim=-1))


def test_ties_pick_the_first_maximum():
    # rows of few distinct values: the maximum repeats within a block and across blocks
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 3, (64, 8 * BLOCK), generator=g).float()
    x[0] = 5.0  # every index ties: 0
    x[1, BLOCK + 3] = x[1, 5 * BLOCK + 1] = 9.0  # the earlier block's
    x[2, 2 * BLOCK + 7] = x[2, 2 * BLOCK + 4] = 9.0  # the earlier index in one block
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    assert argmax(x)[:3].tolist() == [0, BLOCK + 3, 2 * BLOCK + 4]


def test_nan_and_infinities_as_torch():
    x = torch.randn(5, 4 * BLOCK, generator=torch.Generator().manual_seed(2))
    x[0, 3 * BLOCK + 2] = float("nan")  # NaN is the maximum
    x[1, 2 * BLOCK] = x[1, BLOCK + 9] = float("nan")  # its first NaN
    x[1, 10] = float("inf")
    x[2] = float("-inf")  # all -inf: index 0
    x[3, 100] = float("inf")
    x[4, -1] = float("inf")
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    assert argmax(x).tolist()[:4] == [3 * BLOCK + 2, BLOCK + 9, 0, 100]


def test_other_widths_fall_back():
    x = torch.randn(4, 1000)  # not a multiple of BLOCK
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    x = torch.randn(4, BLOCK)
    assert torch.equal(argmax(x), x.argmax(dim=-1))


def test_non_contiguous_rows():
    base = torch.randn(4, 16, 2 * BLOCK, generator=torch.Generator().manual_seed(3))
    x = base[:, 0]  # a strided slice, as the rollout's base[:, 0]
    assert not x.is_contiguous()
    assert torch.equal(argmax(x), x.argmax(dim=-1))
