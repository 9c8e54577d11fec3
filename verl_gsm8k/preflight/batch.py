"""Whether a step's batch splits into mini-batches as verl asserts (both multiplied by rollout.n
first, which changes nothing): the knob check and the preflight ask the same question."""

from __future__ import annotations


def batch_split_problem(
    batch: int,
    mini: int,
    batch_name: str = "TRAIN_BATCH_SIZE",
    mini_name: str = "PPO_MINI_BATCH_SIZE",
) -> str | None:
    """Why a batch of ``batch`` prompts does not split into mini-batches of ``mini``, or None."""
    if mini > batch:
        return f"{mini_name}={mini} is larger than {batch_name}={batch}"
    if batch % mini:
        return (f"{batch_name}={batch} does not split into mini-batches of {mini_name}={mini} "
                f"(verl asserts {batch} % {mini} == 0 at the first update)")  # fmt: skip
    return None
