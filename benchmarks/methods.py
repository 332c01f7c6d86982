"""The one table of named serving configurations ("methods") every benchmark selects from
(throughput.py, acceptance.py, serving.py): a name, a label for tables and plots, the
`domino-sglang serve` flags (SGLang's own and DOMINO's `--speculative-domino-*` options after
"--"; {drafter} and {block} filled in) and any extra environment (a base tree's PYTHONPATH).

Old names stay accepted (ALIASES): acceptance.py's `backbone`, `bare`, `domino`, `nocopy`,
`domino-s1`, `lookup`, `adaptive`; serving.py's `domino` (now `domino-drafter`, the full block
every round, as acceptance.py's `domino` was).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType


@dataclass(frozen=True)
class Method:
    """One server configuration: what `domino-sglang serve` is started with."""

    label: str
    serve: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    def server_args(self, drafter: str, dtype: str, block: int = 16
                    ) -> tuple[list[str], list[str]]:
        """(`domino-sglang serve` flags with --dtype, SGLang's own flags) for start_server."""
        flags = [f.format(drafter=drafter, block=block) for f in self.serve]
        cut = flags.index("--") if "--" in flags else len(flags)
        return flags[:cut] + ["--dtype", dtype], flags[cut + 1:]

    def with_env(self, **extra: str) -> Method:
        """The same method with more environment (e.g. the PYTHONPATH of a base tree)."""
        return replace(self, env={**self.env, **extra})

    def with_options(self, *options: str) -> Method:
        """The same method with more SGLang / DOMINO flags (after `--`)."""
        sep = () if "--" in self.serve else ("--",)
        return replace(self, serve=(*self.serve, *sep, *options))

    @property
    def speculative(self) -> bool:
        """Served by the DOMINO worker (not plain decoding, not SGLang's NGRAM)."""
        return "--no-speculation" not in self.serve


D = "--speculative-domino-"  # DOMINO's options (domino_sglang/spec/options.py), SGLang flags


def _domino(*options: str) -> tuple[str, ...]:
    """`domino-sglang serve` flags of a DOMINO method with these DOMINO options after `--`."""
    return ("--drafter", "{drafter}", *(("--", *options) if options else ()))


# acceptance is a property of the drafter: the full block verified every round, drafted by the
# drafter alone (no prompt lookup)
_FULL_BLOCK = (D + "adaptive", "off", D + "lookup", "off")

METHODS: Mapping[str, Method] = MappingProxyType({
    "ar": Method("AR", ("--no-speculation",)),
    # plain decoding on SGLang's synchronous scheduler, as DOMINO runs (no overlap scheduling)
    "ar-sync": Method("AR, synchronous scheduler", ("--no-speculation", "--",
                                                    "--disable-overlap-schedule")),
    "ngram": Method("NGRAM", ("--no-speculation", "--", "--speculative-algorithm", "NGRAM",
                              "--speculative-num-draft-tokens", "{block}")),
    # the drafter alone, full block every round (tau is the drafter's)
    "domino-drafter": Method("DOMINO", _domino(*_FULL_BLOCK)),
    # the same with the head off: the DFlash baseline; a pointer drafter keeps its copy path
    "domino-backbone": Method("DOMINO head off", _domino(*_FULL_BLOCK, D + "debug-head", "off")),
    # a pointer drafter's backbone without its copy path either: the DFlash baseline proper
    # (the same as domino-backbone for a drafter without a copy gate)
    "domino-bare": Method("DOMINO head and copy off",
                          _domino(*_FULL_BLOCK, D + "debug-head", "off", D + "debug-copy", "off")),
    # a pointer drafter's head without its copy path (the 2 x 2 of head and copy)
    "domino-nocopy": Method("DOMINO copy off", _domino(*_FULL_BLOCK, D + "debug-copy", "off")),
    # sampled drafts at the request's own temperature (draft_temperature_scale 1; the shipped
    # drafter samples at 0.6 T): differs from domino-drafter at temperature > 0 only
    "domino-drafter-s1": Method("DOMINO at T",
                                _domino(*_FULL_BLOCK, D + "draft-temperature-scale", "1")),
    # the full block every round, copied from the request's own history where its last tokens
    # recur (lookup.py; then no draft pass and L = 1 + the copy)
    "domino-fixed": Method("DOMINO + lookup", _domino(D + "adaptive", "off")),
    # as served by default: lookup on, and policy.py may verify fewer tokens (down to plain
    # decoding)
    "domino-adaptive": Method("DOMINO adaptive", _domino()),
    # the served default with greedy drafts verified as one-hot proposals at T > 0 (how SGLang's
    # DFLASH serves sampled requests): what sampling the drafts from q is worth
    "domino-onehot": Method("DOMINO, one-hot drafts",
                            _domino(D + "debug-sampled-drafts", "off")),
    # draft trees of width 4 (spec/tree.py) where the drafter drafts alone, the policy's L as the
    # tree's size; and the same without prompt lookup (every speculative round a tree)
    "domino-tree": Method("DOMINO, trees K=4", _domino(D + "tree-width", "4")),
    "domino-tree-nolookup": Method("DOMINO, trees K=4, no lookup",
                                   _domino(D + "tree-width", "4", D + "lookup", "off")),
    # the adaptive policy without prompt lookup: Domino's drafts only
    "domino-adaptive-nolookup": Method("DOMINO adaptive, no lookup", _domino(D + "lookup", "off")),
    # DOMINO run the way SGLang's DFLASH runs a Domino drafter, for the side by side where stock
    # DFLASH cannot start (the CPU: SGLang refuses DFLASH off CUDA / NPU / XPU): the full block
    # every round, no prompt lookup, no draft vocabulary, no copy gate, the whole block drafted,
    # greedy drafts verified as one-hot proposals at T > 0. The rollout equals upstream's
    # domino_greedy_rollout (tests/model/test_upstream_equivalence.py); the runtime is DOMINO's
    "dflash-like": Method("DFLASH-like drafting, DOMINO runtime", _domino(
        *_FULL_BLOCK, D + "draft-vocab", "off", D + "debug-copy", "off",
        D + "debug-short-draft", "off", D + "debug-sampled-drafts", "off")),
    # every round plain (L = 1): what serving through the DOMINO worker costs with no
    # speculation at all (the adaptive policy's floor, probes and warm-up aside)
    "domino-plain": Method("DOMINO plain rounds", _domino(D + "debug-draft-len", "1")),
    # every round verifies L = 2, 3, 4, 5, 6 or 8 chain tokens: what the adaptive policy could
    # get at a fixed short length
    **{f"domino-l{n}": Method(f"DOMINO L = {n}", _domino(D + "debug-draft-len", str(n)))
       for n in (2, 3, 4, 5, 6, 8)},
    # a chain and a draft tree (width 4) of the same N = 8 or 16 tokens every round, the
    # drafter alone (no prompt lookup): trees against the chain at equal verified budgets
    **{f"domino-chain-n{n}": Method(f"DOMINO chain, N = {n}",
                                    _domino(D + "debug-draft-len", str(n), D + "lookup", "off"))
       for n in (8, 16)},
    **{f"domino-tree-n{n}": Method(f"DOMINO tree K=4, N = {n}",
                                   _domino(D + "debug-draft-len", str(n), D + "lookup", "off",
                                           D + "tree-width", "4"))
       for n in (8, 16)},
    # tensor parallel over 3 CPU ranks (the demo target's 9 heads, 3 KV heads; serve splits the
    # cores over the ranks): plain and served-default DOMINO, beside their one-rank runs
    "ar-tp3": Method("AR, TP 3", ("--no-speculation", "--tp-size", "3")),
    "domino-adaptive-tp3": Method("DOMINO adaptive, TP 3",
                                  ("--drafter", "{drafter}", "--tp-size", "3")),
})

ALIASES: Mapping[str, str] = MappingProxyType({
    "backbone": "domino-backbone", "bare": "domino-bare", "domino": "domino-drafter",
    "nocopy": "domino-nocopy", "domino-s1": "domino-drafter-s1", "lookup": "domino-fixed",
    "adaptive": "domino-adaptive"})

CHOICES = [*METHODS, *ALIASES]  # argparse choices of --methods


def canonical(name: str) -> str:
    """A method's table name (old names mapped); a clear error naming an unknown one."""
    name = ALIASES.get(name, name)
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return name
