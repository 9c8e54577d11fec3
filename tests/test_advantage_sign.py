"""The sign of verl's learning signal in its own functions: a rewarded response gets a positive
advantage on every token (GRPO, GAE) and the clipped PPO loss raises its log-probability."""

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]] * 4)  # 3 response tokens, then padding


def outcome(rewards: list[float]) -> torch.Tensor:
    token_rewards = torch.zeros_like(MASK)
    token_rewards[:, 2] = torch.tensor(rewards)
    return token_rewards


def test_grpo_advantage_is_positive_for_the_better_response_of_each_prompt():
    index = np.array(["a", "a", "b", "b"])  # two prompts, two responses each
    advantages, returns = core_algos.compute_grpo_outcome_advantage(
        outcome([1.0, 0.0, 0.0, 1.0]), MASK, index)  # fmt: skip
    valid = advantages[:, :3]
    assert (valid[[0, 3]] > 0.5).all() and (valid[[1, 2]] < -0.5).all()
    assert (advantages[:, 3] == 0).all()  # padding gets nothing
    same, _ = core_algos.compute_grpo_outcome_advantage(outcome([1.0, 1.0, 0.0, 0.0]), MASK, index)
    assert torch.allclose(same, torch.zeros_like(same))  # all-equal groups teach nothing


def test_gae_advantage_is_positive_where_the_reward_beats_the_critic():
    values = torch.full_like(MASK, 0.5) * MASK  # the critic expects 0.5 everywhere
    advantages, returns = core_algos.compute_gae_advantage_return(
        outcome([1.0, 0.0, 1.0, 0.0]), values, MASK, gamma=torch.tensor(1.0), lam=torch.tensor(1.0)
    )
    valid = advantages[:, :3]
    assert (valid[[0, 2]] > 0).all() and (valid[[1, 3]] < 0).all()
    assert torch.allclose(returns[:, :3], outcome([1.0, 0.0, 1.0, 0.0])[:, 2:3].expand(-1, 3))


def test_clipped_ppo_loss_raises_the_log_prob_of_positive_advantages():
    config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2,
                               "clip_ratio_c": 3.0, "global_batch_info": {}})  # fmt: skip
    old = torch.full_like(MASK, -1.0)
    log_prob = old.clone().requires_grad_(True)
    advantages = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]]).expand_as(MASK)
    loss, _ = core_algos.compute_policy_loss_vanilla(old, log_prob, advantages, MASK, config=config)
    loss.backward()
    step = -log_prob.grad  # gradient descent moves log_prob along -grad
    assert (step[[0, 2], :3] > 0).all() and (step[[1, 3], :3] < 0).all()
    assert (step[:, 3] == 0).all()
