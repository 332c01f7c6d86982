"""What a run reports: log.jsonl, the progress bar and tensorboard (rank 0 only).

log.jsonl holds one JSON object a line: the run (`{"step": 0, "run": ...}`: data, policy,
device), every `log_every` steps the window's means (loss, grad norm, CEs) with its
teacher-forced accuracies and tau_sim, and every `eval_every` steps the held-out evaluation
(evaluate.py). Depends on config.py and curriculum.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from domino_sglang.train.config import TrainConfig
from domino_sglang.train.curriculum import accuracies, tau_sim


class RunReport:
    """The reports of one run on this process: rank 0 writes them, the other ranks nothing."""

    def __init__(self, out: Path, conf: TrainConfig, rank: int, step: int, progress: bool):
        """step: the step the run starts (or resumes) at."""
        self.conf = conf
        self.bar = None
        if progress and rank == 0:
            from tqdm import tqdm

            self.bar = tqdm(total=conf.steps, initial=step, desc="train", unit="step")
        self.log = (out / "log.jsonl").open("a") if rank == 0 else None
        self.tb = _tensorboard(out) if rank == 0 and conf.report_to == "tensorboard" else None
        self.window: dict = {}  # the steps since the last logged line

    def _write(self, entry: dict) -> None:
        self.log.write(json.dumps(entry) + "\n")
        self.log.flush()

    def run(self, info: dict) -> None:
        """A new run's first line: what it trains on, where."""
        if self.log is not None:
            self._write({"step": 0, "run": info})

    def step(self, step: int, st: dict, loss: float, gnorm: float, lam: float, lr: float
             ) -> None:
        """After optimizer step `step` (its loss stats `st`); a line every log_every steps."""
        _accumulate(self.window, st, loss, gnorm)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.3f}", lam=f"{lam:.2f}")
        if self.log is None or not (step % self.conf.log_every == 0 or step == self.conf.steps):
            return
        entry = _summary(self.window, step, lam, lr)
        self._write(entry)
        if self.tb is not None:
            for key in ("loss", "lambda", "lr", "grad_norm", "ce_base", "ce_final",
                        "tau_sim_base", "tau_sim_final"):
                self.tb.add_scalar(f"train/{key}", entry[key], step)
        if self.bar is not None:
            self.bar.write(f"step {step}: loss {entry['loss']:.3f} tau_sim base "
                           f"{entry['tau_sim_base']:.2f} final {entry['tau_sim_final']:.2f} "
                           f"acc {' '.join(f'{a:.2f}' for a in entry['acc_final'][:6])}")
        self.window = {}

    def eval(self, ev: dict, live: bool = True) -> None:
        """A held-out evaluation {"step", "eval"}; live: during training (also to tensorboard
        and the bar's postfix), not the starting point's."""
        if self.log is None:
            return
        self._write(ev)
        if live and self.tb is not None:
            for key, value in ev["eval"].items():
                if key.startswith("tau_"):
                    self.tb.add_scalar(f"eval/{key}", value, ev["step"])
        if self.bar is not None:
            self.bar.write(_eval_line(ev))
            if live:
                self.bar.set_postfix(tau=f"{ev['eval']['tau_replay_final']:.2f}")

    def close(self) -> None:
        for sink in (self.bar, self.log, self.tb):
            if sink is not None:
                sink.close()


def _eval_line(ev: dict) -> str:
    e = ev["eval"]
    return (f"eval step {ev['step']}: tau (as served, replayed) base {e['tau_replay_base']:.2f} "
            f"final {e['tau_replay_final']:.2f}; tau_sim base {e['tau_sim_base']:.2f} final "
            f"{e['tau_sim_final']:.2f}, tau_rollout base {e['tau_rollout_base']:.2f} final "
            f"{e['tau_rollout_final']:.2f}")


def _accumulate(window: dict, st: dict, loss: float, gnorm: float) -> None:
    window.setdefault("loss", []).append(loss)
    window.setdefault("grad_norm", []).append(gnorm)
    window.setdefault("ce_base", []).append(st["ce_base"])
    window.setdefault("ce_final", []).append(st["ce_final"])
    for key in ("valid", "correct_base", "correct_final"):
        prev = window.get(key)
        window[key] = st[key] if prev is None else [x + y for x, y in zip(prev, st[key])]


def _summary(window: dict, step: int, lam: float, lr: float) -> dict:
    mean = {k: sum(v) / len(v) for k, v in window.items() if k in
            ("loss", "grad_norm", "ce_base", "ce_final")}
    acc_b = accuracies(window["valid"], window["correct_base"])
    acc_f = accuracies(window["valid"], window["correct_final"])
    return {"step": step, "lambda": lam, "lr": lr, **mean, "acc_base": acc_b, "acc_final": acc_f,
            "tau_sim_base": tau_sim(acc_b), "tau_sim_final": tau_sim(acc_f)}


def _tensorboard(out: Path):
    """A SummaryWriter on out/tensorboard, or None (with a note) when tensorboard is absent."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("train: report_to = tensorboard, but tensorboard is not installed "
              "(pip install tensorboard); logging to log.jsonl only", flush=True)
        return None
    return SummaryWriter(str(out / "tensorboard"))
