"""Whether a batch splits into mini-batches as verl asserts (knobs and preflight)."""


def batch_split_problem(
    batch: int,
    mini: int,
    batch_name: str = "TRAIN_BATCH_SIZE",
    mini_name: str = "PPO_MINI_BATCH_SIZE",
) -> str | None:
    if mini > batch:
        return f"{mini_name}={mini} is larger than {batch_name}={batch}"
    if batch % mini:
        return (f"{batch_name}={batch} does not split into mini-batches of {mini_name}={mini} "
                f"(verl asserts {batch} % {mini} == 0 at the first update)")  # fmt: skip
    return None
