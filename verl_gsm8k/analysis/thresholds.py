"""The constants of the report's health checks, each with the reason for its value.

Standard library only. The one place where they are defined: docs/reading-a-ppo-run.md repeats
them in its table of checks (a test compares the two), and summary.json and the HTML page list
them. Build a ``Thresholds(...)`` and pass it to ``summary.analyse`` to try other values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    """Constants of the health checks, each with the reason for its value.

    Windows count logged steps. The two real 435-step GSM8K PPO logs (Qwen2.5-0.5B, batch 256)
    were used to make sure none of the warning-level checks fires on a healthy run; the margins
    are noted next to each value.
    """

    # Rolling-median window (steps). Ten steps hide a single noisy batch (a median needs 6 of 10
    # bad points to move) but still localise a change to within about five steps.
    window: int = 10

    # KL growing without bound: the KL series is cut into blocks of max(kl_block_min,
    # steps // kl_blocks) steps; an alarm needs kl_growth_blocks consecutive block-to-block
    # ratios of at least kl_growth_ratio, ending above kl_min_level. Block 0 is not used as a
    # base: KL starts at exactly 0, so any growth out of it is an infinite ratio. Real runs
    # (36-step blocks): one ratio of 1.6-1.7 right after block 0, then <= 1.26, so a single
    # fast block is normal and three in a row is not.
    kl_block_min: int = 10
    kl_blocks: int = 12
    kl_growth_ratio: float = 1.5
    kl_growth_blocks: int = 3
    kl_min_level: float = 0.05

    # KL jump: median of the next kl_jump_after steps above kl_jump_factor x the median of the
    # previous kl_jump_before steps plus kl_jump_abs. The absolute term keeps the normal early
    # rise quiet: the real 256-token run goes from a median of 0.011 to 0.067 around step 33,
    # which stays under 3 x 0.011 + 0.1 = 0.13 (the closest call in either run). Healthy KL on
    # these runs never exceeds 0.35, so +0.1 within 5 steps is a large move.
    kl_jump_before: int = 20
    kl_jump_after: int = 5
    kl_jump_factor: float = 3.0
    kl_jump_abs: float = 0.10

    # Entropy collapse: rolling median below entropy_collapse_frac of the starting level (median
    # of the first window) or below entropy_floor nats/token. The real runs fall from ~0.45 to
    # ~0.055 (12% of the start) while accuracy improves, so the relative bar sits well below that.
    entropy_collapse_frac: float = 0.05
    entropy_floor: float = 0.01

    # Length hacking: the trailing 10-step median response length rises by len_rise (30%) above
    # where it started to climb, while the trailing median score gains at least len_score_gain
    # (5 points of a 0/1 score) over the same span. "Where it started to climb" is the last point
    # of the previous len_lookback steps within len_base_tol (5%, about twice the noise of a
    # 10-step median) of their lowest median, so an earlier, unrelated score gain does not count.
    # Measured this way the real runs' length never rises more than ~5% (it falls by ~30% early
    # while the score climbs); a run creeping up 2-3 points in 100 steps is not "together".
    len_rise: float = 0.30
    len_lookback: int = 100
    len_base_tol: float = 0.05
    len_score_gain: float = 0.05

    # Value loss exploding: rolling median above vf_explode_factor x the lowest rolling median seen
    # so far (ignoring the first window, where a fresh critic's loss is 10-100x its later level).
    # Real runs reach 4.4x (256-token run): while every reward is 0 the critic has nothing to
    # predict and its loss dips to 0.036, then settles near 0.15 once rewards vary. An explosion
    # is an order of magnitude, hence 10x.
    vf_explode_factor: float = 10.0
    # Value loss not decreasing: median of the last quarter >= vf_flat_ratio x median of the
    # first quarter (needs vf_min_steps). Real runs: about 0.6.
    vf_flat_ratio: float = 0.95
    vf_min_steps: int = 40
    # The critic diverging: a step's value loss above critic_start_factor x the run's first
    # logged value loss AND above critic_loss_floor, from the second step on (a 2-step smoke run
    # is judged; value_loss_explosion needs 20 steps). The first step is the base, not a median
    # of several: a critic with too high a learning rate diverges from its second step, so any
    # later step already holds the divergence. A fresh critic starts at its highest (the real
    # runs: 14 and 5.8), so the base errs on the quiet side. The floor: verl's value loss is half
    # the squared error, so a critic whose values stay within the range of 0/1 returns has a loss
    # of at most 0.5 (the real runs: at most 0.27 from step 10 on); a critic that started at
    # ~0 (every reward 0) and then sees rewards vary rises many times its start, healthy, and
    # stays under it. Measured: healthy runs reach at most 1.18 x their start (the real
    # 512-token run's step 1), the CPU smoke runs with a critic lr of 1e-1 11-58 x at step 2
    # (11 x where step 1 had already begun to diverge), so 5 sits 4.2 x above the one and 2.3 x
    # below the other; every run and number: docs/reliability.md, "The watchdog's thresholds,
    # checked against real runs" (its critic paragraph).
    critic_start_factor: float = 5.0
    critic_loss_floor: float = 1.0

    # Accuracy flat: the smoothed accuracy (median of 3 validations, or the rolling-median train
    # score when there are fewer than acc_min_val_points validations) has not beaten its best by
    # acc_min_gain (one point of accuracy) for acc_flat_steps steps at the end of the run. A
    # warning if it never rose at all (nothing is being learnt), otherwise a note: a plateau is
    # worth knowing (more steps buy little) but is no fault. The real runs slow down after step
    # ~190 yet still make their last one-point gains at steps 379 (256 tokens) and 339 (512
    # tokens), 50 and 90 steps before their last validation, so neither gets the note.
    acc_min_gain: float = 0.01
    acc_flat_steps: int = 100
    acc_min_val_points: int = 4

    # Accuracy below its best: the last validation is lower than the best earlier one by at least
    # a bar = max(acc_drop_floor, min(acc_drop_abs, acc_drop_rel x best)), and, when the run
    # tells the number n of validation problems (its validation/<step>.jsonl dumps), at least
    # acc_drop_z standard errors of the difference of two evaluations, sqrt(2 p (1-p) / n) with p
    # the mean of the two accuracies. Two sources of noise make a drop unclear. Evaluation: an
    # accuracy over n problems has a standard error of about sqrt(p (1-p) / n), 0.05 on 100
    # problems, 0.014 on GSM8K's 1319; the z-term covers it (2.5 SE of an independent
    # difference is conservative: greedy evaluations of nearby checkpoints on the same problems
    # are correlated, and the best is the highest of several, so the bar must sit well above
    # 2 SE). Training wobble: a healthy run's accuracy moves from one checkpoint to the next by
    # more than the evaluation noise; the real runs end 0.036 (512 tokens, best 0.579 -> 0.543,
    # 2.6 SE on 1319 problems) and 0.012 below their best, and 0.10 is about three times the
    # larger. acc_drop_rel scales the bar down for a low-accuracy run (a fall from 0.20 to 0.14
    # loses a third of what was learnt), acc_drop_floor keeps it above the noise of accuracies
    # near 0. Verl logs no n; a console log or a lone metrics file gets the bar without the
    # z-term, which is clear from about 300 problems up (0.10 = 2.5 SE of a difference at p = 0.5,
    # n = 312).
    acc_drop_abs: float = 0.10
    acc_drop_rel: float = 0.25
    acc_drop_floor: float = 0.03
    acc_drop_z: float = 2.5

    # KL growing while the train score does not: over the last kl_gain_frac of the steps where
    # both are logged (at least kl_gain_min_steps steps), cut into thirds, the median KL rises
    # from third to third, ending at least kl_gain_ratio x and kl_gain_abs above where it
    # started, with at least kl_gain_late_share of that rise in its last leg (middle to last
    # third), while the median train score of the last third is less than kl_gain_score_min
    # above that of the first. The policy moves away from the reference and buys no reward.
    # kl_gain_ratio: a KL growing linearly from 0 grows 1.57x over the last half (the thirds'
    # medians sit at 7/12, 9/12 and 11/12 of the run), so 1.5x catches steady growth; healthy
    # runs let the KL level off. kl_gain_late_share: linear growth puts half its rise in the
    # last leg; a KL that jumped and then stayed (kl_jump's case) or has levelled off puts
    # little there, and is not "still growing". kl_gain_score_min: 3 points of a 0/1 score,
    # "not risen" within the noise of a median of a few batches. Both bars were checked on every
    # prefix of the two real runs (what --follow shows at each step), not only on the whole runs
    # (last half: KL 1.13x and 1.07x, score +0.02): where their KL grew 1.5x the score gained at
    # least 0.0375 (512 tokens, steps 38-74, the early climb), and where the score gained under
    # 0.03 the KL grew at most 1.34x (256 tokens, steps 77-153). kl_gain_abs keeps a KL that is
    # still ~0 quiet (an idle GRPO kl_loss of 0.005 that doubles). kl_gain_min_steps: ten steps,
    # so that the last half of a 20-step CPU run is judged.
    kl_gain_frac: float = 0.5
    kl_gain_min_steps: int = 10
    kl_gain_ratio: float = 1.5
    kl_gain_abs: float = 0.01
    kl_gain_late_share: float = 0.25
    kl_gain_score_min: float = 0.03
    # ... unless the score of the first third is already within kl_gain_headroom of the top of
    # its range (the worst and best response of the run, critic/score/min and /max): then there
    # is little left for the KL to buy, the run has converged, and the finding is a note (stop
    # earlier), not a warning. 0.2 of a 0/1 score: sampling at temperature 1 keeps the mean of a
    # model that knows the task well below 1 (the CPU learning runs level off at 0.84-0.93 per
    # step while greedy validation is at 0.96-1.00); the real 0.5B GSM8K runs end at 0.70-0.72.
    kl_gain_headroom: float = 0.2

    # Clip fraction: rolling median (clip_window steps) at or below clip_low for at least
    # clip_window steps means the ratio never leaves the trust region (update too small, or a
    # single on-policy mini-batch per step); at or above clip_high means each update goes far past
    # it. The real runs' 20-step medians stay within 0.001-0.005 (logged with three decimals);
    # clip_low = 0.0002 is below that resolution, so only a true ~0 fires. clip_high: with the
    # default clip range 0.2, a fifth of all tokens clipped means most of the update is cut off.
    clip_window: int = 20
    clip_low: float = 0.0002
    clip_high: float = 0.20

    # Rollout/training mismatch: verl compares the token probabilities the inference engine
    # (vLLM) sampled with against the training engine's recomputation of the same tokens
    # (training/rollout_*). A PPO update trusts both to describe one policy. Flagged where the
    # rolling median (window steps) of their Pearson correlation falls below mismatch_corr_min,
    # or where the rolling median of the largest per-token difference exceeds
    # mismatch_jump_factor x its level over the first mismatch_base_steps steps (and at least
    # mismatch_diff_floor, so that a run whose engines agree to ~0 does not fire on noise).
    # These bars are a judgement, not a measurement: neither real log in shared/data has these
    # metrics (its verl predates them). Engines in step differ by rounding only; a correlation
    # of 0.99 already leaves 2% of the variance of the probabilities unexplained, and stale
    # weights or other kernels move whole tokens, hence a factor 3 on the largest difference.
    # Tune them on your own healthy runs.
    mismatch_corr_min: float = 0.99
    mismatch_base_steps: int = 20
    mismatch_jump_factor: float = 3.0
    mismatch_diff_floor: float = 0.10
    # The gap's absolute level, from verl's own FAQ ("Missmatch between inference and training",
    # docs/faq/faq.rst of verl): training/rollout_probs_diff_mean "should be below 0.005"; "higher
    # than 0.01 ... indicates a precision issue from the inference engine". A warning where the
    # rolling median (window steps, or all of a shorter run) of the mean gap exceeds
    # mismatch_mean_harmful, a note above mismatch_mean_normal, for at least half a window.
    # fp32 engines on this CPU agree to ~1e-9 (docs/algorithms.md, "Train/inference mismatch").
    mismatch_mean_normal: float = 0.005
    mismatch_mean_harmful: float = 0.01

    # DAPO's dynamic sampling (algorithm.filter_groups, verl_gsm8k/analysis/sampling.py): the
    # share of the prompt groups a step generated that were dropped (no signal, or surplus),
    # above dropped_groups_share as a rolling median (window steps, or all of a shorter run) for
    # at least half a window. 0.75: four groups generated for each one trained on, a step's
    # generation four times what the batch needs. Nothing in verl 0.9.1's v1 trainer caps it; the
    # CPU DAPO run on the converged toy task passes it in its second half (docs/algorithms.md).
    dropped_groups_share: float = 0.75

    # Checks from the per-token trace (verl_gsm8k/replay/checks.py), each over traced steps.
    # A flat critic: among the traced steps whose responses' scores differ (standard deviation
    # >= trace_score_spread, a tenth of a 0/1 score), at least trace_steps (and half of them)
    # where the critic's values over every traced token vary by less than critic_flat_std (std).
    # The CPU learning runs' critics, poor as they are (explained variance ~0.1), vary by
    # 0.03-0.35 on such steps; a critic that outputs a constant varies by ~0.
    trace_steps: int = 3
    trace_score_spread: float = 0.1
    critic_flat_std: float = 0.005
    # GRPO groups without a spread: the share of a step's prompt groups (the whole batch) whose
    # responses all scored the same, at or above zero_spread_share for trace_steps consecutive
    # steps. Those groups get zero advantage: nothing is learned from them. A warning when most
    # of them are at the step's lowest score (all wrong: the task is out of reach), a note when
    # they are at the highest (converged: the CPU GRPO learning runs end there).
    zero_spread_share: float = 0.8
    # Stale weights seen on the traced tokens: the mean |p_vLLM - p_actor| of a step's traced
    # tokens above trace_prob_gap for trace_steps consecutive steps. A judgement like the
    # mismatch bars: fp32 engines on the CPU agree to ~1e-5; bf16 engines differ by rounding
    # (well under 0.01 on average); a weight sync that missed an update moves whole tokens.
    trace_prob_gap: float = 0.01


THRESHOLDS = Thresholds()
