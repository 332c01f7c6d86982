"""The device-neutral decode round: plan, proposers, rollout, verify, sampling, policy, metrics."""
