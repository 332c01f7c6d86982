"""Custom logit processors for the server tests (imported by the server: SGLang ships them as
dill pickles of importable classes, resolved by module name in the scheduler process)."""

from __future__ import annotations

import torch
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor


class ForceAfter(CustomLogitProcessor):
    """Once a request has `after` output tokens, force `token` (reads the request's history,
    like SGLang's thinking-budget processors). Params: {"after": K, "token": T}."""

    def __call__(self, logits: torch.Tensor, custom_param_list=None) -> torch.Tensor:
        for i, params in enumerate(custom_param_list):
            if len(params["__req__"].output_ids) >= params["after"]:
                logits[i] = float("-inf")
                logits[i, params["token"]] = 0.0
        return logits


class BanArgmax(CustomLogitProcessor):
    """Ban each row's current best token (reads logit values, so where it runs in the sampler's
    order matters: after the logit bias, as plain decoding runs it)."""

    def __call__(self, logits: torch.Tensor, custom_param_list=None) -> torch.Tensor:
        logits.scatter_(1, logits.argmax(-1, keepdim=True), float("-inf"))
        return logits
