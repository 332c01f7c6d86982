"""The copy path of a pointer-generator drafter: copy candidates from a sequence's own history and
the gate that mixes them into the draft distribution.

The first draft's misses are mostly copies from the context (benchmarks/studies/first_draft.py),
and a gate over a drafter trained without one gains little (benchmarks/studies/copy_gate.py). So
the drafter is trained WITH the copy, as a pointer-generator (See et al. 2017, the idea): at
block position i, history h = x_0 .. x_{a+i} (teacher-forced in training, committed tokens + the
chain at serve time),

    c_i, n_i = the token after the most recent occurrence of the longest suffix (n_i <= 12
               tokens) of h that recurs earlier in h; c_i = -1, n_i = 0 when x_{a+i} is new
    g_i      = sigmoid(w . [z_i ; onehot(n_i)] + b)            (0 where c_i = -1)
    q_i(v)   = (1 - g_i) p_i(v) + g_i [v = c_i]

p_i the drafter's own distribution (backbone at i = 0, backbone + head after). q_i is what is
drafted and, sampled, what is verified (a proper distribution: exact as any other q). Trained in
the same CE as p (curriculum.py), p no longer has to spend its mass where the copy is right.

Serving (`CopyPaths`, asked by proposers/domino.py; rollout.py `pointer_pick` /
`pointer_sample` mix the copy in): each running request's history index (history.py, the one
prompt lookup reads too) is extended by the tokens committed since its last round; at position
i the rollout asks it for (c_i, n_i) of history + the chain drafted so far
(`PointerCopy.gate_at`), so serving sees
exactly the candidates training did. Greedy drafts argmax q; sampled requests draw from q and
verify against it. p(c) is 0 where the served p has no row for c
(outside the draft vocabulary or the head's candidate pool): the copy can draft any token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from domino_sglang.model.config import COPY_MAX_MATCH
from domino_sglang.spec.history import HistoryIndex, HistoryIndexes
from domino_sglang.spec.suffix_match import NO_COPY, suffix_matches


def copy_table(ids: list[int], max_match: int = COPY_MAX_MATCH) -> tuple[torch.Tensor,
                                                                       torch.Tensor]:
    """(candidates [T], match lengths [T]) int64: row t is (c, n) of the history ids[:t + 1]
    (module docstring), ties between occurrences of the longest suffix to the most recent.

    One dict per suffix length n maps each n-gram to where it last ended: T * max_match lookups
    per sequence, linear in its length."""
    last: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_match + 1)]
    cand = torch.full((len(ids),), NO_COPY, dtype=torch.long)
    match = torch.zeros(len(ids), dtype=torch.long)
    for t in range(len(ids)):
        top = min(max_match, t + 1)
        for n in range(top, 0, -1):  # the longest suffix that occurred before first
            s = last[n].get(tuple(ids[t - n + 1: t + 1]))
            if s is not None:
                cand[t], match[t] = ids[s + 1], n
                break
        for n in range(1, top + 1):  # then this position's n-grams become history
            last[n][tuple(ids[t - n + 1: t + 1])] = t
    return cand, match


def gate_inputs(z: torch.Tensor, match: torch.Tensor) -> torch.Tensor:
    """z [.., H] and match lengths [..] -> the gate's input [.., H + COPY_MAX_MATCH + 1]."""
    onehot = F.one_hot(match.clamp(0, COPY_MAX_MATCH), COPY_MAX_MATCH + 1).to(z.dtype)
    return torch.cat((z, onehot), dim=-1)


def log_gate(gate_logit: torch.Tensor, cand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log g, log(1 - g)) [..] in float32; g = 0 where there is no candidate."""
    x = gate_logit.float()
    none = cand < 0
    return (F.logsigmoid(x).masked_fill(none, float("-inf")),
            F.logsigmoid(-x).masked_fill(none, 0.0))


def mixed_log_prob(log_p: torch.Tensor, token: torch.Tensor, cand: torch.Tensor,
                   log_g: torch.Tensor, log_1mg: torch.Tensor) -> torch.Tensor:
    """log q(token) = log((1 - g) p(token) + g [token = c]); all [..], log_p = log p(token)
    (-inf for a token the drafter cannot draft)."""
    drafted = log_1mg + log_p
    copied = torch.where((token == cand) & (cand >= 0), log_g, float("-inf"))
    # q = 0 where both are -inf; logaddexp's gradient there is NaN (even times 0), so it runs
    # on zeros at those positions
    zero = (drafted == float("-inf")) & (copied == float("-inf"))
    out = torch.logaddexp(drafted.masked_fill(zero, 0.0), copied.masked_fill(zero, 0.0))
    return out.masked_fill(zero, float("-inf"))


def copy_wins(log_p_pick: torch.Tensor, log_p_cand: torch.Tensor, cand: torch.Tensor,
              log_g: torch.Tensor, log_1mg: torch.Tensor) -> torch.Tensor:
    """Greedy argmax of q [..] bool: the candidate beats the drafter's own pick when
    (1 - g) p(c) + g > (1 - g) p(pick)."""
    return (cand >= 0) & (torch.logaddexp(log_1mg + log_p_cand, log_g) > log_1mg + log_p_pick)


class PointerCopy:
    """What a round's rollout needs for a pointer drafter's copy path: the gate and, per request,
    the copy index of its history (x_t last) and the chain drafted so far this round."""

    on_host = True  # candidates from host HistoryIndexes (`found`)

    def __init__(self, gate: torch.nn.Linear, indexes: list[HistoryIndex], device: torch.device):
        self.gate, self.indexes, self.device = gate, indexes, device
        self.chains: list[list[int]] = [[] for _ in indexes]
        self.z_logit: torch.Tensor | None = None  # [bs, n] the gate's z-part, set by start()
        self.won: list[torch.Tensor] = []  # per position [bs] bool: the greedy pick was the copy

    def start(self, z: torch.Tensor) -> None:
        """The gate's logit w . [z_i; onehot(n_i)] + b splits into w_z . z_i (one GEMM for every
        position of the round, z [bs, n, H]) and w_n[n_i] + b (a lookup per position)."""
        w = self.gate.weight  # [1, H + COPY_MAX_MATCH + 1]
        bs, n, h = z.shape
        # 2-D and contiguous (rollout.base_logits: strided 3-D inputs take a slow CPU GEMM path)
        self.z_logit = F.linear(z.reshape(bs * n, h).to(w.dtype), w[:, :h]).view(bs, n).float()
        self.match_logit = (w[0, h:] + self.gate.bias).float()  # [COPY_MAX_MATCH + 1]

    def found(self) -> list[tuple[int, int]]:
        """(c, n) of every request's history + chain so far, host lookups (history.py)."""
        return [ix.copy_candidate(ch) for ix, ch in zip(self.indexes, self.chains)]

    def candidates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(c, n) [bs] of every request's history + chain so far (host lookups)."""
        out = torch.tensor(self.found(), dtype=torch.int64).view(-1, 2).to(self.device)
        return out[:, 0], out[:, 1]

    def log_gate(self, i: int, cand: torch.Tensor, match: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log g, log(1 - g)) [bs] float32 at position i of the round (after start())."""
        logit = self.z_logit[:, i] + self.match_logit[match.clamp(0, COPY_MAX_MATCH)]
        return log_gate(logit, cand)

    def gate_at(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Position i's copy: (candidate c [bs], log g [bs], log(1 - g) [bs]) of every
        request's history + chain so far (the rollout's one question per position)."""
        c, n = self.candidates()
        return (c, *self.log_gate(i, c, n))

    def append(self, tokens: torch.Tensor, won: torch.Tensor | None = None) -> None:
        """The tokens [bs] chosen at this position join each chain; won [bs] bool: where they
        are the copy winning a greedy pick (metrics)."""
        for chain, tok in zip(self.chains, tokens.tolist()):
            chain.append(tok)
        if won is not None:
            self.won.append(won)

    def copied(self) -> torch.Tensor:
        """[bs, n] bool: the greedy positions of this round drafted by the copy."""
        return torch.stack(self.won, dim=1)


def device_candidates(seq: torch.Tensor, last: torch.Tensor, max_match: int = COPY_MAX_MATCH
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """copy_table's (c, n) of each row's prefix seq[b, :last[b] + 1], on the device, with no
    host synchronisation and static shapes (CUDA-graph safe): seq [bs, T] int64 (left-aligned
    histories, anything after last[b]), last [bs] int64 (>= 0). Returns (c [bs], n [bs]).

        match[b, e] = the longest common suffix (<= max_match) of seq[b, :e+1] and
                      seq[b, :last+1], for e < last; n = max_e match, c = seq[b, e* + 1] at the
                      largest e* with match = n (the most recent occurrence); (NO_COPY, 0) if n = 0
    The same answer as HistoryIndex.copy_candidate (tests); match lengths by
    suffix_match.suffix_matches."""
    t_cap = seq.shape[1]
    match = suffix_matches(seq, last, max_match)  # [bs, T]
    ends = torch.arange(t_cap, device=seq.device)  # e
    best = match.amax(dim=1)  # [bs]
    at = torch.where((match == best[:, None]) & (best[:, None] > 0), ends, -1).amax(dim=1)
    nxt = seq.gather(1, (at + 1).clamp(min=0, max=t_cap - 1)[:, None]).squeeze(1)
    found = best > 0
    return torch.where(found, nxt, NO_COPY), best


class DevicePointerCopy(PointerCopy):
    """PointerCopy with the copy index on the device: each request's history (x_t last) in a
    left-aligned [bs, T + n] buffer whose chain part is written in place as drafts are chosen,
    candidates by `device_candidates`. No host synchronisation and no per-request Python state
    per position; the same (c, n) as HistoryIndex (tests/spec/test_pointer.py)."""

    on_host = False

    def __init__(self, gate: torch.nn.Linear, history: torch.Tensor, lens: torch.Tensor,
                 n: int):
        """history [bs, T] int64 (row b's first lens[b] entries are its history, x_t last),
        lens [bs] int64 >= 1, n the positions this round drafts."""
        super().__init__(gate, [], history.device)
        bs, t = history.shape
        self.seq = torch.cat((history, history.new_full((bs, n), NO_COPY)), dim=1)  # [bs, T+n]
        self.last = lens.to(torch.int64) - 1  # [bs] the sequence's last position (x_t)

    def candidates(self) -> tuple[torch.Tensor, torch.Tensor]:
        return device_candidates(self.seq, self.last)

    def append(self, tokens: torch.Tensor, won: torch.Tensor | None = None) -> None:
        self.last = self.last + 1
        self.seq.scatter_(1, self.last[:, None], tokens[:, None].to(self.seq.dtype))
        if won is not None:
            self.won.append(won)


def copy_index_on_device(device: torch.device | str, where: str | None = None) -> bool:
    """Whether the worker keeps copy indexes on the device (DeviceHistories + DevicePointerCopy:
    no host synchronisation per draft position) or on the host (HistoryIndex: dict lookups, the
    cheaper choice where host and device are one). `where` = "device" / "host"
    (--speculative-domino-debug-copy-index); by default device on CUDA, host on the CPU."""
    if where is None:
        return torch.device(device).type != "cpu"
    if where not in ("device", "host"):
        raise ValueError(f"copy index must be 'device' or 'host', got {where!r}")
    return where == "device"


class DeviceHistories:
    """Each running request's prompt + output (x_t last) in one device buffer [R, T] int64, a
    row per request, extended round by round by the tokens committed since (one host-to-device
    copy per round for the whole batch; a request's full history only when it first appears or
    restarts). The host keeps only each row's request id and length: no per-request Python list
    is rebuilt per round (only the new tokens are sliced from the request's own lists)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.buf = torch.zeros(0, 0, dtype=torch.int64, device=self.device)  # [R, T]
        self.slot: dict[str, int] = {}  # request id -> row
        self.length: dict[str, int] = {}  # request id -> tokens stored

    def _grow(self, rows: int, cols: int) -> None:
        r, t = self.buf.shape
        if rows <= r and cols <= t:
            return
        new = torch.zeros(max(rows, 2 * r), max(cols, 2 * t, 64), dtype=torch.int64,
                          device=self.device)
        new[:r, :t] = self.buf
        self.buf = new

    def update(self, reqs) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring every request of `reqs` (SGLang Reqs: rid, origin_input_ids, output_ids) up to
        date and drop the others. Returns (history [bs, T], lens [bs]) on the device, row b the
        b-th request's tokens left-aligned (anything after lens[b])."""
        keep = {r.rid for r in reqs}
        for rid in [k for k in self.slot if k not in keep]:
            del self.slot[rid], self.length[rid]
        used = set(self.slot.values())
        free = (i for i in range(len(reqs) + len(used)) if i not in used)
        rows, cols, toks, order, lens = [], [], [], [], []
        for req in reqs:
            prompt, out = req.origin_input_ids, req.output_ids
            n = len(prompt) + len(out)
            done = self.length.get(req.rid, 0)
            if req.rid not in self.slot:
                self.slot[req.rid] = next(free)
            if done > n:  # restarted: shorter than what was stored
                done = 0
            new = (prompt[done:] + out) if done < len(prompt) else out[done - len(prompt):]
            row = self.slot[req.rid]
            rows += [row] * len(new)
            cols += range(done, n)
            toks += new
            self.length[req.rid] = n
            order.append(row)
            lens.append(n)
        self._grow(max(self.slot.values()) + 1, max(lens))
        bs, m = len(reqs), len(toks)
        # the round's one host-to-device copy: new tokens (row, col, token), rows, lengths;
        # from pinned memory on CUDA, so it is queued without the host waiting for the stream
        packed = torch.tensor(rows + cols + toks + order + lens, dtype=torch.int64)
        if self.device.type == "cuda":
            packed = packed.pin_memory()
        packed = packed.to(self.device, non_blocking=True)
        self.buf[packed[:m], packed[m:2 * m]] = packed[2 * m:3 * m]
        index = packed[3 * m:3 * m + bs]
        return self.buf[index, :max(lens)], packed[3 * m + bs:]


class CopyPaths:
    """A pointer drafter's copy indexes across rounds and each round's copy path over them: on
    the device (`DeviceHistories` + `DevicePointerCopy`: no host synchronisation per draft
    position) or on the host (each running request's `HistoryIndex`, shared with prompt
    lookup: dict lookups), as copy_index_on_device chose. `gate`: the drafter's copy gate."""

    def __init__(self, gate: torch.nn.Linear, device: torch.device | str, on_device: bool,
                 histories: HistoryIndexes):
        self.gate, self.on_device = gate, on_device
        self.histories = DeviceHistories(device) if on_device else None
        self.indexes = histories  # the host indexes, by request id (history.py)

    def history(self, reqs, bonus: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The device index's round input: every request's prompt + output, x_t last (history
        [bs, T], lens [bs]; one host-to-device copy, no synchronisation). A request whose
        recorded output does not end in x_t (it would: rounds run synchronously) copies from
        x_t and its chain only, as the host index does."""
        history, lens = self.histories.update(reqs)  # [bs, T], [bs]
        last = history.gather(1, (lens - 1).clamp(min=0)[:, None]).squeeze(1)
        ok = (lens > 0) & (last == bonus)  # else: [x_t] alone
        history = history.clone()
        history[:, 0] = torch.where(ok, history[:, 0], bonus.to(history.dtype))
        return history, torch.where(ok, lens, torch.ones_like(lens))

    def for_round(self, reqs, bonus: torch.Tensor, n: int,
                  history: tuple[torch.Tensor, torch.Tensor] | None = None) -> PointerCopy:
        """The round's copy path over n positions: each request's index brought up to its
        prompt + output (x_t last; only the new tokens are indexed, none where prompt lookup
        asked this round already), the indexes of requests that left the batch dropped. On the
        device: `history` (the round's, when the caller already took it); on the host: a read
        of x_t and host lookups per position."""
        if self.histories is not None:
            return DevicePointerCopy(self.gate, *(history or self.history(reqs, bonus)), n)
        self.indexes.keep_only(reqs)
        indexes = []
        for req, x_t in zip(reqs, bonus.tolist()):
            index = self.indexes.synced(req)
            if index.last_token != x_t:  # not x_t last: x_t alone
                index = HistoryIndex(self.indexes.max_tokens)
                index.sync([x_t], [])
            indexes.append(index)
        return PointerCopy(self.gate, indexes, bonus.device)
