"""The bf16 few-row kernel (domino_sglang/cpu/gemv.c, gemv.py): its numbers, row-invariance at
every row count and thread count, and the oneDNN fallback where it cannot run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from domino_sglang.cpu import gemv, linear

needs_kernel = pytest.mark.skipif(not gemv.available(),
                                  reason=f"bf16 kernel unavailable: {gemv.unavailable_reason()}")


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The exact product of the bf16 values, in float64."""
    return F.linear(x.double(), w.double(), None if bias is None else bias.double())


@needs_kernel
@pytest.mark.parametrize("n", [1, 31, 32, 1000])
def test_kernel_is_the_bf16_product_rounded_once(n):
    """Each output is the fp32-accumulated dot product rounded to bf16: within half a bf16 ulp
    of the exact product plus the fp32 accumulation's error, bias or not, for widths that do
    and do not fill the last 32-output block."""
    torch.manual_seed(n)
    w = (torch.randn(n, 576) * 0.05).bfloat16()
    bias = torch.randn(n).bfloat16()
    packed = gemv.pack(w)
    for rows in (1, 5, 8, 9, 17):
        x = torch.randn(rows, 576).bfloat16()
        for b in (None, bias):
            exact = reference(x, w, b)
            out = gemv.linear(x, packed, b)
            assert out.dtype == torch.bfloat16 and out.shape == (rows, n)
            # bf16 keeps 8 significant bits: half an ulp is 2^-9 of the value; fp32 sums of
            # 576 terms add well under 1e-4 absolute here
            bound = exact.abs() * 2.0 ** -8 + 1e-4
            assert bool(((out.double() - exact).abs() <= bound).all()), (rows, b is None)


@needs_kernel
def test_a_row_gets_the_same_bits_whatever_shares_its_call():
    """A verify pass computes row i among up to 16 others; a plain step computes it alone. The
    kernel gives both the same bits (tiles of 8 rows, a partial last tile, any thread count),
    for the shapes of a Llama layer, the down projection included."""
    torch.manual_seed(3)
    threads = torch.get_num_threads()
    try:
        for n, k in [(960, 576), (3072, 576), (576, 1536), (4000, 576)]:
            w = (torch.randn(n, k) * 0.05).bfloat16()
            packed = gemv.pack(w)
            x = torch.randn(19, k).bfloat16()
            torch.set_num_threads(1)
            alone = torch.cat([gemv.linear(x[i:i + 1], packed) for i in range(19)])
            for rows in (2, 6, 8, 9, 16, 19):
                assert torch.equal(gemv.linear(x[:rows], packed), alone[:rows]), (n, k, rows)
            torch.set_num_threads(2)
            assert torch.equal(gemv.linear(x, packed), alone), (n, k, "2 threads")
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_kernel_takes_strided_and_batched_inputs_through_packed_linear():
    torch.manual_seed(4)
    w = (torch.randn(200, 64) * 0.1).bfloat16()
    packed = linear.pack(w)
    assert isinstance(packed, gemv.Packed)  # bf16 goes to the kernel where it runs
    wide = torch.randn(4, 3 * 64).bfloat16()
    strided = wide[:, 64:128]  # a view, as SGLang's split q/k/v can be
    assert torch.equal(linear.packed_linear(strided, packed),
                       linear.packed_linear(strided.contiguous(), packed))
    x3 = torch.randn(2, 3, 64).bfloat16()
    out = linear.packed_linear(x3, packed)
    assert out.shape == (2, 3, 200)
    assert torch.equal(out.reshape(6, 200), linear.packed_linear(x3.reshape(6, 64), packed))
    with pytest.raises(ValueError, match="does not fit"):
        gemv.linear(torch.randn(1, 64), packed)  # fp32 input on a bf16 pack
    assert gemv.pack(torch.randn(8, 63).bfloat16()) is None  # odd K: oneDNN's
    assert gemv.pack(torch.randn(8, 64)) is None  # fp32: oneDNN's


def test_without_the_kernel_bf16_stays_on_onednn(monkeypatch):
    """No compiler (or the kill switch): the reason is kept, nothing is built, and a bf16
    weight gets oneDNN's pack as before."""
    monkeypatch.setattr(gemv, "_library", None)
    monkeypatch.setattr(gemv, "_unavailable", None)
    monkeypatch.setattr(gemv.shutil, "which", lambda name: None)
    assert not gemv.available()
    assert "no C compiler" in gemv.unavailable_reason()
    w = torch.randn(64, 32).bfloat16()
    packed = linear.pack(w)
    assert packed is None or isinstance(packed, torch.Tensor)  # oneDNN's (None: no bf16 here)

    monkeypatch.setattr(gemv, "_unavailable", None)
    monkeypatch.setenv(gemv.DISABLE_ENV, "1")
    assert not gemv.available()
    assert gemv.unavailable_reason() == f"{gemv.DISABLE_ENV}=1"


def test_a_failed_build_says_why_and_leaves_no_file(monkeypatch, tmp_path):
    monkeypatch.setattr(gemv, "_library", None)
    monkeypatch.setattr(gemv, "_unavailable", None)
    monkeypatch.setenv("DOMINO_SGLANG_HOME", str(tmp_path))
    monkeypatch.delenv(gemv.DISABLE_ENV, raising=False)
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(gemv, "SOURCE", broken)
    if gemv.shutil.which("cc") is None and gemv.shutil.which("gcc") is None:
        pytest.skip("no C compiler here")
    assert not gemv.available()
    assert "could not build broken.c" in gemv.unavailable_reason()
    assert list((tmp_path / "kernels").iterdir()) == []
