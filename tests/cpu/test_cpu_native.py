"""The native bf16 kernels (domino_sglang/cpu/native.c, native.py): the linear's numbers and its
row-invariance at every row and thread count, the norm and rotary against SGLang's own modules,
and the fallback where the kernels cannot run."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from domino_sglang.cpu import linear, native

needs_native = pytest.mark.skipif(
    not native.available(), reason=f"native kernels unavailable: {native.unavailable_reason()}")


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The exact product of the bf16 values, in float64."""
    return F.linear(x.double(), w.double(), None if bias is None else bias.double())


@needs_native
@pytest.mark.parametrize("n", [1, 31, 32, 1000])
def test_kernel_is_the_bf16_product_rounded_once(n):
    """Each output is the fp32-accumulated dot product rounded to bf16: within half a bf16 ulp
    of the exact product plus the fp32 accumulation's error, bias or not, for widths that do
    and do not fill the last 32-output block."""
    torch.manual_seed(n)
    w = (torch.randn(n, 576) * 0.05).bfloat16()
    bias = torch.randn(n).bfloat16()
    packed = native.pack(w)
    for rows in (1, 5, 8, 9, 17):
        x = torch.randn(rows, 576).bfloat16()
        for b in (None, bias):
            exact = reference(x, w, b)
            out = native.linear(x, packed, b)
            assert out.dtype == torch.bfloat16 and out.shape == (rows, n)
            # bf16 keeps 8 significant bits: half an ulp is 2^-9 of the value; fp32 sums of
            # 576 terms add well under 1e-4 absolute here
            bound = exact.abs() * 2.0 ** -8 + 1e-4
            assert bool(((out.double() - exact).abs() <= bound).all()), (rows, b is None)


@needs_native
def test_a_row_gets_the_same_bits_whatever_shares_its_call():
    """A verify pass computes row i among up to 16 others; a plain step computes it alone. The
    kernel gives both the same bits (tiles of 8 rows, a partial last tile, any thread count),
    for the shapes of a Llama layer, the down projection included."""
    torch.manual_seed(3)
    threads = torch.get_num_threads()
    try:
        for n, k in [(960, 576), (3072, 576), (576, 1536), (4000, 576)]:
            w = (torch.randn(n, k) * 0.05).bfloat16()
            packed = native.pack(w)
            x = torch.randn(19, k).bfloat16()
            torch.set_num_threads(1)
            alone = torch.cat([native.linear(x[i:i + 1], packed) for i in range(19)])
            for rows in (2, 6, 8, 9, 16, 19):
                assert torch.equal(native.linear(x[:rows], packed), alone[:rows]), (n, k, rows)
            torch.set_num_threads(2)
            assert torch.equal(native.linear(x, packed), alone), (n, k, "2 threads")
    finally:
        torch.set_num_threads(threads)


@needs_native
def test_kernel_takes_strided_and_batched_inputs_through_packed_linear():
    torch.manual_seed(4)
    w = (torch.randn(200, 64) * 0.1).bfloat16()
    packed = linear.pack(w)
    assert isinstance(packed, native.Packed)  # bf16 goes to the kernel where it runs
    wide = torch.randn(4, 3 * 64).bfloat16()
    strided = wide[:, 64:128]  # a view, as SGLang's split q/k/v can be
    assert torch.equal(linear.packed_linear(strided, packed),
                       linear.packed_linear(strided.contiguous(), packed))
    x3 = torch.randn(2, 3, 64).bfloat16()
    out = linear.packed_linear(x3, packed)
    assert out.shape == (2, 3, 200)
    assert torch.equal(out.reshape(6, 200), linear.packed_linear(x3.reshape(6, 64), packed))
    with pytest.raises(ValueError, match="does not fit"):
        native.linear(torch.randn(1, 64), packed)  # fp32 input on a bf16 pack
    assert native.pack(torch.randn(8, 63).bfloat16()) is None  # odd K: oneDNN's
    assert native.pack(torch.randn(8, 64)) is None  # fp32: oneDNN's


def test_without_the_kernel_bf16_stays_on_onednn(monkeypatch):
    """No compiler (or the kill switch): the reason is kept, nothing is built, and a bf16
    weight gets oneDNN's pack as before."""
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_unavailable", None)
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    assert not native.available()
    assert "no C compiler" in native.unavailable_reason()
    w = torch.randn(64, 32).bfloat16()
    packed = linear.pack(w)
    assert packed is None or isinstance(packed, torch.Tensor)  # oneDNN's (None: no bf16 here)

    monkeypatch.setattr(native, "_unavailable", None)
    monkeypatch.setenv(native.DISABLE_ENV, "1")
    assert not native.available()
    assert native.unavailable_reason() == f"{native.DISABLE_ENV}=1"


def test_a_failed_build_says_why_and_leaves_no_file(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_unavailable", None)
    monkeypatch.setenv("DOMINO_SGLANG_HOME", str(tmp_path))
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(native, "SOURCE", broken)
    if native.shutil.which("cc") is None and native.shutil.which("gcc") is None:
        pytest.skip("no C compiler here")
    assert not native.available()
    assert "could not build broken.c" in native.unavailable_reason()
    assert list((tmp_path / "kernels").iterdir()) == []


def _sglang_rmsnorm(hidden: int, eps: float):
    pytest.importorskip("sglang")
    from domino_sglang.sglang_compat import RMSNorm

    norm = RMSNorm(hidden, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden) + 0.5)
    return norm.to(torch.bfloat16)


@needs_native
@torch.no_grad()
def test_norm_is_sglangs_forward_native():
    """The residual stream is SGLang's bit for bit; the normed rows equal SGLang's but where the
    sum of squares' order moves a last bit (at most one bf16 step, and rarely); each row's
    numbers are its own whatever rows share the call."""
    torch.manual_seed(5)
    for hidden in (576, 100):  # 100: a tail past the last 16 lanes
        norm = _sglang_rmsnorm(hidden, 1e-5)
        x = (torch.randn(21, hidden) * 3).bfloat16()
        residual = torch.randn(21, hidden).bfloat16()
        want, want_residual = norm.forward_native(x, residual)
        got, got_residual = native.add_rmsnorm(x, residual, norm.weight, norm.variance_epsilon)
        assert torch.equal(got_residual, want_residual)
        steps = (got.float() - want.float()).abs() / (want.float().abs() * 2.0 ** -7 + 1e-30)
        assert float(steps.max()) <= 1.0 and float((got != want).float().mean()) < 0.01
        alone = torch.cat([native.add_rmsnorm(x[i:i + 1], residual[i:i + 1], norm.weight,
                                              norm.variance_epsilon)[0] for i in range(21)])
        assert torch.equal(alone, got)
        first, none = native.add_rmsnorm(x, None, norm.weight, norm.variance_epsilon)
        assert none is None
        steps = (first.float() - norm.forward_native(x).float()).abs()
        assert float((steps / (first.float().abs() * 2.0 ** -7 + 1e-30)).max()) <= 1.0


@needs_native
def test_silu_mul_is_sglangs_forward_native():
    """SiluAndMul.forward_native's formula, F.silu(gate) * up in bf16, from a strided view of
    the gate/up projection: equal but where the exponential's last fp32 bit moves a rounding
    (at most one bf16 step, rarely); large gates of either sign included (e^-g overflows)."""
    torch.manual_seed(9)
    wide = (torch.randn(5, 2 * 1536 + 64) * 4).bfloat16()
    wide[0, :8] = torch.tensor([100.0, -100.0, 0.0, -0.0, 88.0, -90.0, 1e-3, -1e-3])
    x = wide[:, :2 * 1536]  # rows 2 * 1536 + 64 apart
    want = F.silu(x[..., :1536]) * x[..., 1536:]
    got = native.silu_mul(x)
    steps = (got.float() - want.float()).abs() / (want.float().abs() * 2.0 ** -7 + 1e-30)
    assert got.shape == want.shape
    assert float(steps.max()) <= 1.0 and float((got != want).float().mean()) < 0.01
    assert torch.equal(got[0, :8], want[0, :8])


@needs_native
def test_rotary_is_sglangs_apply_rotary_emb_bit_for_bit():
    """Neox rotary over every head of q and k, read straight out of the fused qkv projection
    (a strided view), equals SGLang's apply_rotary_emb on the same bf16 tables."""
    pytest.importorskip("sglang")
    from domino_sglang.sglang_compat import apply_rotary_emb

    torch.manual_seed(6)
    tokens, dim, q_heads, kv_heads = 7, 64, 9, 3
    qkv = (torch.randn(tokens, (q_heads + 2 * kv_heads) * dim) * 2).bfloat16()
    q, k, _ = qkv.split([q_heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    angles = torch.rand(tokens, dim // 2) * 100
    # the halves of one cos_sin_cache row each, as rope_tables takes them: strided views
    cos, sin = torch.cat([angles.cos(), angles.sin()], dim=-1).bfloat16().chunk(2, dim=-1)
    for part, heads in ((q, q_heads), (k, kv_heads)):
        want = apply_rotary_emb(part.reshape(tokens, heads, dim), cos, sin, True)
        got = native.rope(part, cos, sin, dim)
        assert got.shape == part.shape and torch.equal(got, want.reshape(tokens, -1))


@needs_native
def test_attention_rows_are_the_plain_steps_rows():
    """A verify of n tokens after a prefix attends each query as the plain step that decodes
    it would (the same keys, up to its own): bit for bit, causal flag or the equivalent bool
    mask; a tree mask hides what it says; GQA as SDPA's (query head h reads KV head h // 3)."""
    from torch.nn.functional import scaled_dot_product_attention

    torch.manual_seed(7)
    hq, hkv, d, prefix, n = 9, 3, 64, 37, 6
    slots = 200
    k_cache = torch.randn(slots, hkv, d).bfloat16()
    v_cache = torch.randn(slots, hkv, d).bfloat16()
    locs = torch.randperm(slots)[:prefix + n]  # scattered slots, prefix then the new tokens
    q = torch.randn(n, hq, d).bfloat16()
    verify = torch.empty(n, hq, d, dtype=torch.bfloat16)
    native.attend(q, k_cache, v_cache, locs, None, True, 0.125, verify)
    for i in range(n):
        step = torch.empty(1, hq, d, dtype=torch.bfloat16)
        native.attend(q[i:i + 1], k_cache, v_cache, locs[:prefix + i + 1], None, False, 0.125,
                      step)
        assert torch.equal(step[0], verify[i]), i
    causal = torch.arange(n)[:, None] + prefix >= torch.arange(prefix + n)[None, :]
    masked = torch.empty_like(verify)
    native.attend(q, k_cache, v_cache, locs, causal, False, 0.125, masked)
    assert torch.equal(masked, verify)
    # against SDPA in float32 over the gathered keys, with a tree mask hiding some keys
    tree = causal.clone()
    tree[3, prefix + 1] = tree[5, 2] = False
    native.attend(q, k_cache, v_cache, locs, tree, False, 0.125, masked)
    want = scaled_dot_product_attention(
        q.float().transpose(0, 1), k_cache[locs].float().transpose(0, 1),
        v_cache[locs].float().transpose(0, 1), attn_mask=tree, scale=0.125, enable_gqa=True)
    torch.testing.assert_close(masked.float(), want.transpose(0, 1), atol=1e-2, rtol=1e-2)
    assert not torch.equal(masked[3], verify[3]) and torch.equal(masked[:3], verify[:3])
    for i in range(n):  # the plain step over only the keys the node sees, in order
        step = torch.empty(1, hq, d, dtype=torch.bfloat16)
        native.attend(q[i:i + 1], k_cache, v_cache, locs[tree[i]], None, False, 0.125, step)
        assert torch.equal(step[0], masked[i]), i


def _greedy(server, ids: list[int], tokens: int) -> list[int]:
    import requests

    r = requests.post(f"{server.url}/generate", json={"input_ids": ids, "sampling_params": {
        "temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}}, timeout=300)
    r.raise_for_status()
    return r.json()["output_ids"]


@pytest.mark.server
@needs_native
def test_bf16_domino_is_plain_decoding_token_for_token(ar_server_bf16, chat_ids):
    """With the native kernels every row of a bf16 forward is computed on its own (linears,
    norms, rotary, attention), so DOMINO's verify rows are the plain steps' rows: its greedy
    output equals plain bf16 decoding token for token, one request at a time and four in
    flight (other batch sizes). Without them 2 of 8 sequences matched (measured by hand)."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.harness.servers import start_server

    prompts, tokens = chat_ids[:4], 40
    plain = [_greedy(ar_server_bf16, ids, tokens) for ids in prompts]
    with start_server("domino-bf16", ["--dtype", "bfloat16", "--max-total-tokens", "16384"]) as s:
        assert "norms, rotary and activation on the native kernels" in s.log()
        alone = [_greedy(s, ids, tokens) for ids in prompts]
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda ids: _greedy(s, ids, tokens), prompts))
    assert alone == plain and together == plain
    assert all(len(o) == tokens for o in plain)


@needs_native
@torch.no_grad()
def test_a_bf16_drafter_on_the_native_kernels_computes_what_it_did():
    """fuse_drafter swaps a bf16 drafter's norms and rotary for the native kernels: its
    rotations are apply_rope's bits, its norms within a bf16 step of model.RMSNorm's, so its
    context K/V and backbone output stay within bf16 noise of the torch modules', the state
    dict unchanged; an fp32 drafter is left alone."""
    from domino_sglang.model.config import parse_draft_config
    from domino_sglang.model.drafter import DominoDrafter, apply_rope, rope_cos_sin
    from tests.model.test_drafter_loading import UPSTREAM_LIKE

    torch.manual_seed(8)
    rope = rope_cos_sin(torch.arange(40, 47), 64, 1e6)
    x = (torch.randn(7, 5, 64) * 3).bfloat16()
    assert torch.equal(native.rope_f32(x, rope), apply_rope(x, rope))

    conf = parse_draft_config(UPSTREAM_LIKE, "/tmp/d")
    fp32 = DominoDrafter(conf).eval()
    assert not native.fuse_drafter(fp32)
    drafter = DominoDrafter(conf).eval().to(torch.bfloat16)
    for name, p in drafter.named_parameters():  # norms off 1, so their weights matter
        if name.endswith("norm.weight"):
            p.copy_(torch.rand_like(p.float()) + 0.5)
    feats = torch.randn(9, drafter.fc.in_features).bfloat16()
    positions = torch.arange(9)
    block = torch.randn(4, conf.hidden_size).bfloat16()

    def attend(i, q, k, v):
        return v.repeat_interleave(q.shape[1] // v.shape[1], dim=1) + q  # shapes only

    before = drafter.context_kv(feats, positions), drafter.backbone(block, positions[:4], attend)
    state = {k: v.clone() for k, v in drafter.state_dict().items()}
    assert native.fuse_drafter(drafter)
    assert type(drafter.norm).__name__ == "NativeRMSNorm"
    after = drafter.context_kv(feats, positions), drafter.backbone(block, positions[:4], attend)
    assert all(torch.equal(v, state[k]) for k, v in drafter.state_dict().items())
    for (k0, v0), (k1, v1) in zip(before[0], after[0]):
        torch.testing.assert_close(k1.float(), k0.float(), atol=0.05, rtol=0.02)
        assert torch.equal(v1, v0)  # no norm, no rotation
    torch.testing.assert_close(after[1].float(), before[1].float(), atol=0.05, rtol=0.02)


@needs_native
@pytest.mark.parametrize("vocab", [None, torch.tensor([9, 2, 5, 0, 7])])
def test_the_native_head_drafts_argmax_q_as_the_reference(vocab):
    """NativeHead (the CPU's fused greedy positions) drafts what the head's definition does:
    the head's logits, the first maximal column, the pointer copy's win against argmax q built
    explicitly (tests/spec/test_pointer.py's reference), for an open and a closed gate and without
    a copy path, and over a candidate pool what the torch loop drafts; greedy_rollout takes it
    where it is set, and a head whose embedding is not bf16 (an fp32 server) gets none."""
    from torch import nn

    from domino_sglang.spec.rollout import greedy_rollout
    from tests.spec.test_pointer import _gate, _pointer, _reference_pointer_rollout
    from tests.spec.test_rollout import B, H, V, make_head

    rng = random.Random(5)
    histories = [[rng.randrange(4) if k % 2 else rng.randrange(V) for k in range(9)]
                 for _ in range(6)]
    head = make_head(3)
    table = head.embed.weight.detach().bfloat16()
    head.embed = nn.Embedding.from_pretrained(table.float())  # the reference: bf16 values
    assert native.native_head(head.with_vocab(vocab)) is None  # fp32 embedding: none
    served = head.with_vocab(vocab)
    served.embed = nn.Embedding.from_pretrained(table)
    served.native = native.native_head(served)
    assert served.native is not None
    z = torch.randn(6, B, H)
    bonus = torch.tensor([h[-1] for h in histories])
    copied = 0
    with torch.no_grad():
        for bias in (3.0, -1.0):
            gate = _gate(bias)
            copy = _pointer(gate, histories)
            got = greedy_rollout(z, bonus, served, 0, True, copy=copy)
            want, won = _reference_pointer_rollout(z, histories, head, gate, True, vocab)
            assert torch.equal(got, want), (bias, got, want)
            assert torch.equal(copy.copied(), won)
            copied += int(won.sum())
        plain = greedy_rollout(z, bonus, served, 0, True)
        fused = served.native
        served.native = None
        assert torch.equal(greedy_rollout(z, bonus, served, 0, True), plain)
        # a candidate pool of 3 columns (positions >= 1): as the torch loop drafts
        for gate in (_gate(3.0), None):
            chains, won = [], []
            for head_native in (fused, None):
                served.native = head_native
                copy = None if gate is None else _pointer(gate, histories)
                chains.append(greedy_rollout(z, bonus, served, 3, True, copy=copy))
                won.append(None if copy is None else copy.copied())
            assert torch.equal(chains[0], chains[1])
            assert gate is None or torch.equal(won[0], won[1])
    assert copied > 5


@needs_native
@pytest.mark.parametrize("vocab_rows", [0, 110])  # all 150 columns, or a draft vocabulary
@pytest.mark.parametrize("pool", [0, 70])
def test_the_native_head_at_vector_widths_drafts_as_the_torch_loop(vocab_rows, pool):
    """At widths that fill and overrun the kernels' 16-lane vectors and 64-column tiles (hidden
    40, GRU 20, head 37, 150 tokens), the native head drafts what the torch loop does, the
    copy's wins included, with and without a draft vocabulary and a candidate pool."""
    from torch import nn

    from domino_sglang.spec.history import HistoryIndex
    from domino_sglang.spec.pointer import PointerCopy
    from domino_sglang.spec.rollout import HeadParams, greedy_rollout

    h, g, e, v, block = 40, 20, 37, 150, 7
    torch.manual_seed(11)
    table = (torch.randn(v, h) * 0.5).bfloat16()
    gru = nn.GRU(h, g, bias=False, batch_first=True)
    proj = nn.Sequential(nn.Linear(h + g, e, bias=False), nn.SiLU(), nn.Linear(e, v, bias=False))
    for p in [*gru.parameters(), *proj.parameters()]:
        nn.init.normal_(p, std=0.7)
    head = HeadParams(embed=nn.Embedding.from_pretrained(table), lm_head_weight=torch.randn(v, h),
                      prefix_gru=gru, embed_proj=proj)
    served = head.with_vocab(torch.randperm(v)[:vocab_rows] if vocab_rows else None)
    served.native = native.native_head(served)
    assert served.native is not None
    gate = nn.Linear(h + 13, 1)
    nn.init.normal_(gate.weight, std=1.0)
    nn.init.constant_(gate.bias, 1.0)
    rng = random.Random(4)
    histories = [[rng.randrange(12) for _ in range(30)] for _ in range(5)]
    z, bonus = torch.randn(5, block, h), torch.tensor([x[-1] for x in histories])

    def drafts(fused):
        served.native = fused
        indexes = [HistoryIndex(block - 1) for _ in histories]
        for index, x in zip(indexes, histories):
            index.sync(x, [])
        copy = PointerCopy(gate, indexes, torch.device("cpu"))
        with torch.no_grad():
            return greedy_rollout(z, bonus, served, pool, True, copy=copy), copy.copied()

    fused = served.native
    (got, got_won), (want, want_won) = drafts(fused), drafts(None)
    assert torch.equal(got, want) and torch.equal(got_won, want_won)
    assert 0 < int(want_won.sum()) < want_won.numel()  # the copy wins some, not all


@needs_native
@pytest.mark.parametrize("size", [8, 16])
def test_the_native_head_grows_the_trees_the_torch_loop_grows(size):
    """A draft tree's whole growth over a candidate pool in one native call (NativeHead.grow,
    `domino_tree_grow`) grows the trees the torch steps grow (tree.py), at widths that fill and
    overrun the 16-lane vectors (hidden 40, GRU 20, head 37, pool 70 of 150 tokens): the same
    tokens, parents, depths and branches for every request, with two given branches (the
    chain, and one that ends early in some rows and repeats the chain's first token in others,
    so that a path is offered twice)."""
    from torch import nn

    from domino_sglang.spec.rollout import HeadInputs, HeadParams, greedy_rollout
    from domino_sglang.spec.tree import grow_tree

    h, g, e, v, pool, bs = 40, 20, 37, 150, 70, 6
    torch.manual_seed(12)
    table = (torch.randn(v, h) * 0.5).bfloat16()
    gru = nn.GRU(h, g, bias=False, batch_first=True)
    proj = nn.Sequential(nn.Linear(h + g, e, bias=False), nn.SiLU(), nn.Linear(e, v, bias=False))
    for p in [*gru.parameters(), *proj.parameters()]:
        nn.init.normal_(p, std=0.7)
    head = HeadParams(embed=nn.Embedding.from_pretrained(table), lm_head_weight=torch.randn(v, h),
                      prefix_gru=gru, embed_proj=proj)
    fused = native.native_head(head)
    assert fused is not None
    z, bonus = torch.randn(bs, size, h), torch.randint(0, v, (bs,))
    with torch.no_grad():
        inputs = HeadInputs.of(z, head, pool)
        chain = greedy_rollout(z, bonus, head, pool, inputs=inputs)  # [bs, size - 1]
        other = torch.randint(0, v, chain.shape)
        other[:3, 0] = chain[:3, 0]  # rows 0-2: a path the chain offers too
        other[3:, 2:] = -1  # rows 3-5: the branch ends after two tokens
        trees = []
        for head_native in (fused, None):
            head.native = head_native
            trees.append(grow_tree(z, bonus, head, size, 4, branches=(chain, other),
                                   inputs=inputs))
    assert (trees[1].branch == 1).any() and (trees[1].branch == -1).any()
    for name in ("tokens", "parents", "depths", "branch"):
        assert torch.equal(getattr(trees[0], name), getattr(trees[1], name)), name
