"""A minimal policy-gradient update in plain PyTorch: the yardstick for verl's learning runs.

Independent of verl on purpose: GRPO's group baseline, token-mean loss, AdamW, clipping at 1.0.
If verl's run on the same model falls while this rises, the wiring is at fault; if both fall, the
settings are.
"""

import random
from dataclasses import dataclass

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rewards.gsm8k import compute_score


@dataclass(frozen=True)
class Problem:
    messages: list[dict[str, str]]
    ground_truth: str


def load_problems(parquet_path: str) -> list[Problem]:
    """The rows of a prepared RL parquet (``data_prep.gsm8k``): chat prompt and ground truth."""
    rows = pq.read_table(parquet_path).to_pylist()
    return [Problem(r["prompt"], r["reward_model"]["ground_truth"]) for r in rows]


class Policy:
    def __init__(self, model_dir: str, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )

    def _encode(self, problems: list[Problem]):
        texts = [
            self.tokenizer.apply_chat_template(
                p.messages, add_generation_prompt=True, tokenize=False
            )
            for p in problems
        ]
        return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    @torch.no_grad()
    def sample(self, problems: list[Problem], greedy: bool, max_new_tokens: int = 32):
        """(prompt encoding, response ids, response mask up to and including the first EOS)."""
        self.model.eval()
        enc = self._encode(problems)
        sampling = {"do_sample": False} if greedy else {"do_sample": True, "top_k": 0, "top_p": 1.0}
        out = self.model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            **sampling,
        )
        responses = out[:, enc["input_ids"].shape[1] :]
        eos = self.tokenizer.eos_token_id
        mask = torch.zeros_like(responses, dtype=torch.float32)
        for i, ids in enumerate(responses.tolist()):
            mask[i, : ids.index(eos) + 1 if eos in ids else len(ids)] = 1.0
        return enc, responses, mask

    def texts(self, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
        return [
            self.tokenizer.decode(ids[: int(m.sum())], skip_special_tokens=True)
            for ids, m in zip(responses, mask, strict=True)
        ]

    def scores(self, problems: list[Problem], responses, mask) -> torch.Tensor:
        return torch.tensor(
            [
                float(compute_score("openai/gsm8k", text, p.ground_truth)["score"])
                for text, p in zip(self.texts(responses, mask), problems, strict=True)
            ]
        )

    def greedy_accuracy(self, problems: list[Problem], batch: int = 128) -> float:
        total = 0.0
        for i in range(0, len(problems), batch):
            chunk = problems[i : i + batch]
            _, responses, mask = self.sample(chunk, greedy=True)
            total += float(self.scores(chunk, responses, mask).sum())
        return total / len(problems)


def train(
    policy: Policy,
    train_set: list[Problem],
    steps: int,
    prompts_per_step: int,
    n: int,
    lr: float,
    seed: int = 0,
    sign: float = 1.0,
) -> list[float]:
    """``steps`` group-baseline policy-gradient updates; returns the mean sampled score per step.
    ``sign=-1`` flips the advantages (a control: it must make the model worse)."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=0.0)
    train_scores = []
    for _ in range(steps):
        problems = [p for p in rng.sample(train_set, prompts_per_step) for _ in range(n)]
        enc, responses, mask = policy.sample(problems, greedy=False)
        rewards = policy.scores(problems, responses, mask)
        groups = rewards.view(prompts_per_step, n)
        advantages = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)
        advantages = sign * advantages
        policy.model.train()
        ids = torch.cat([enc["input_ids"], responses], dim=1)
        attention = torch.cat([enc["attention_mask"], mask.long()], dim=1)
        prompt_len = enc["input_ids"].shape[1]
        logits = policy.model(input_ids=ids, attention_mask=attention).logits
        logp = torch.log_softmax(logits[:, prompt_len - 1 : -1].float(), dim=-1)
        token_logp = logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
        loss = -(token_logp * advantages.view(-1, 1) * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        train_scores.append(float(rewards.mean()))
    return train_scores
