"""The module under training: the drafter with the target's frozen embedding and lm_head.

`forward` drafts every block of a sequence in one backbone pass (as served: each block sees the
context features of positions < its anchor, and itself non-causally) and returns the
curriculum loss of curriculum.py. Depends on model.drafter, spec.pointer and curriculum.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from domino_sglang.model.drafter import DominoDrafter
from domino_sglang.spec.pointer import copy_table, gate_inputs
from domino_sglang.train.curriculum import IGNORE, block_loss


class DrafterTrainModule(nn.Module):
    """Drafter + frozen target embedding/lm_head; forward(batch) -> (loss, stats)."""

    def __init__(self, drafter: DominoDrafter, embed_weight: torch.Tensor,
                 lm_head_weight: torch.Tensor, draft_vocab: torch.Tensor | None = None):
        super().__init__()
        self.drafter = drafter
        self.register_buffer("embed_weight", embed_weight, persistent=False)
        self.register_buffer("lm_head_weight", lm_head_weight, persistent=False)
        # token ids [Vd] the served rollout drafts from (vocab.py): the loss and the rollouts
        # run over it (None: the full vocabulary)
        self.draft_vocab = draft_vocab

    def forward(self, items: list[tuple], lam: float, gamma: float,
                soft: list[tuple] | None = None, distill: float = 0.0, tau: float = 1.0
                ) -> tuple[torch.Tensor, dict]:
        """items: (ids [T], features [T, K*H], anchors[, first-draft-only anchors[, draft
        lengths [n]]]) per sequence; all of a sequence's blocks are drafted in one backbone
        pass. soft: per sequence the target's top-k (ids [T, k], logits [T, k]) for the
        distillation term of weight `distill` at temperature `tau` (curriculum.py)."""
        conf = self.drafter.conf
        B, P = conf.block_size, conf.block_size - 1
        zs, prevs, labels, z0s, y0s = [], [], [], [], []
        tops: list[list[torch.Tensor]] = [[], [], [], []]  # ids, logits; position-0 ids, logits
        for j, (ids, feats, anchors, *rest) in enumerate(items):
            first = rest[0] if rest else []
            lengths = rest[1] if len(rest) > 1 else None
            z, prev, lab = self._blocks(ids, feats, list(anchors) + list(first), B, lengths)
            n = len(anchors)
            zs.append(z[:n])
            prevs.append(prev[:n])
            labels.append(lab[:n])
            z0s.append(z[n:, 0])  # [m, H]
            y0s.append(lab[n:, 0])  # [m]
            if soft is not None:  # label at x_{a+k+1}: the target's row after x_{a+k}
                dev = soft[j][0].device
                rows = (torch.tensor(list(anchors) + list(first), device=dev)[:, None]
                        + torch.arange(P, device=dev)).clamp(max=len(ids) - 1)  # [n+m, P]
                top_ids, top_logits = soft[j][0][rows].long(), soft[j][1][rows]  # [n+m, P, k]
                tops[0].append(top_ids[:n])
                tops[1].append(top_logits[:n])
                tops[2].append(top_ids[n:, 0])
                tops[3].append(top_logits[n:, 0])
        z, prev, lab = torch.cat(zs), torch.cat(prevs), torch.cat(labels)  # [N, P, ..]
        assert z.shape[1] == P
        copy = None
        if self.drafter.copy_gate is not None:  # the copy path of a pointer drafter
            z0 = torch.cat(z0s)
            c, c0 = self._copies(items, P)  # (candidates, match lengths) [N, P] and [M]
            c, c0 = [tuple(t.to(z.device) for t in pair) for pair in (c, c0)]
            gate = self.drafter.copy_gate
            copy = (c[0], gate(gate_inputs(z, c[1])).squeeze(-1),
                    c0[0], gate(gate_inputs(z0, c0[1])).squeeze(-1))
        return block_loss(z, prev, lab, self.lm_head_weight, self.drafter.prefix_gru,
                          self.drafter.embed_proj, lam, gamma, (torch.cat(z0s), torch.cat(y0s)),
                          self.draft_vocab, tuple(torch.cat(t) for t in tops)
                          if soft is not None else None, distill, tau, copy)

    @staticmethod
    def _copies(items: list[tuple], P: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """The copy candidate and match length (pointer.copy_table) of every label position:
        for the block at anchor a, position k's history is x_0 .. x_{a+k} (teacher-forced).
        Returns ((cand, match) [N, P] of the blocks, (cand, match) [M] of the first-only rows),
        in `forward`'s order."""
        blocks: list[list[torch.Tensor]] = [[], []]
        firsts: list[list[torch.Tensor]] = [[], []]
        for ids, _, anchors, *rest in items:
            first = rest[0] if rest else []
            cand, match = copy_table(ids.tolist())
            ends = (torch.tensor(list(anchors) + list(first), dtype=torch.long)[:, None]
                    + torch.arange(P)).clamp(max=len(ids) - 1)  # [n+m, P]
            n = len(anchors)
            blocks[0].append(cand[ends[:n]])
            blocks[1].append(match[ends[:n]])
            firsts[0].append(cand[ends[n:, 0]])
            firsts[1].append(match[ends[n:, 0]])
        return ((torch.cat(blocks[0]), torch.cat(blocks[1])),
                (torch.cat(firsts[0]), torch.cat(firsts[1])))

    def _blocks(self, ids: torch.Tensor, feats: torch.Tensor, anchors: list[int], B: int,
                lengths: torch.Tensor | None = None):
        """Draft every block of one sequence in one backbone pass.

        Returns z [n, B-1, H], GRU inputs [n, B-1, H] (embeds of x_a..x_{a+B-2}), labels [n, B-1].
        lengths [n] (2..B, default B): block j is drafted as [x_a, MASK x (L_j - 1)] alone, i.e.
        its keys past L_j are masked out and its labels from position L_j - 1 on are IGNORE.
        """
        conf = self.drafter.conf
        T, n, dev = ids.shape[0], len(anchors), ids.device
        a = torch.tensor(anchors, device=dev)  # [n]
        offs = torch.arange(B, device=dev)
        pos = (a[:, None] + offs).reshape(-1)  # [n*B] block positions
        chain = torch.full((n, B), conf.mask_token_id, dtype=torch.long, device=dev)
        chain[:, 0] = ids[a]
        if lengths is not None:
            lengths = lengths.to(dev)
        ctx_kv = self.drafter.context_kv(feats, torch.arange(T, device=dev))  # k, v [T, Hkv, D]
        # mask [n*B, T + n*B]: context positions < a (own anchor), and the own block, all of it
        blk = torch.arange(n, device=dev).repeat_interleave(B)  # [n*B] block index of each query
        ctx_ok = torch.arange(T, device=dev)[None, :] < a[blk][:, None]
        own_ok = blk[:, None] == blk[None, :]
        if lengths is not None:  # a short block's queries see only its first L_j positions
            own_ok &= (offs.repeat(n) < lengths[blk])[None, :]
        mask = torch.cat((ctx_ok, own_ok), dim=1)
        rep = conf.num_heads // conf.num_kv_heads

        def attend(i: int, q, k, v):
            kk = torch.cat((ctx_kv[i][0], k)).repeat_interleave(rep, dim=1)  # [T+nB, Hq, D]
            vv = torch.cat((ctx_kv[i][1], v)).repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q.transpose(0, 1), kk.transpose(0, 1),
                                                 vv.transpose(0, 1), attn_mask=mask)
            return out.transpose(0, 1)  # [nB, Hq, D]

        embeds = F.embedding(chain.reshape(-1), self.embed_weight)  # [n*B, H]
        z = self.drafter.backbone(embeds, pos, attend).view(n, B, -1)[:, : B - 1]
        tgt = a[:, None] + offs[None, : B - 1]  # [n, B-1] positions of x_a .. x_{a+B-2}
        inside = tgt + 1 < T
        if lengths is not None:
            inside &= offs[None, : B - 1] < (lengths[:, None] - 1)
        lab = torch.where(inside, ids[(tgt + 1).clamp(max=T - 1)], torch.full_like(tgt, IGNORE))
        prev = F.embedding(ids[tgt.clamp(max=T - 1)], self.embed_weight)  # [n, B-1, H]
        return z, prev, lab
