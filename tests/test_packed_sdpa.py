"""Packed rows with position_ids under sdpa give the padded batch's log-probs and entropies."""

import pytest
import torch

from verl_gsm8k.common.tiny_model import tiny_config

TOLERANCE = 1e-4
LENGTHS = [(5, 17), (12, 9), (3, 28), (20, 4)]  # (left padding, real tokens) per row


def padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows with left padding (prompts) and right padding (responses), as verl's batches have."""
    width = max(left + n for left, n in LENGTHS) + 3
    gen = torch.Generator().manual_seed(0)
    ids = torch.zeros(len(LENGTHS), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (left, n) in enumerate(LENGTHS):
        ids[i, left : left + n] = torch.randint(1, vocab, (n,), generator=gen)
        mask[i, left : left + n] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # verl's compute_position_id_with_mask
    return ids, mask, positions


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    m = Qwen2ForCausalLM(tiny_config(attn_implementation="sdpa")).eval()
    assert m.config._attn_implementation == "sdpa"
    return m


def padded_outputs(model, ids, mask, positions):
    from verl.utils import torch_functional as verl_F

    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    labels = torch.roll(ids, shifts=-1, dims=1)
    logp = verl_F.logprobs_from_logits(logits, labels)
    return logp[mask.bool()], verl_F.entropy_from_logits(logits)[mask.bool()]


def packed_outputs(model, ids, mask, positions, with_positions: bool = True):
    """verl's remove-padding path: unpad to one row, position_ids kept, no attention mask."""
    from verl.utils import torch_functional as verl_F
    from verl.utils.attention_utils import index_first_axis, rearrange, unpad_input

    ids_rmpad, indices, *_ = unpad_input(ids.unsqueeze(-1), mask)
    ids_rmpad = ids_rmpad.transpose(0, 1)  # (1, total tokens)
    pos_rmpad = index_first_axis(
        rearrange(positions.unsqueeze(-1), "b s ... -> (b s) ..."), indices)  # fmt: skip
    kwargs = {"position_ids": pos_rmpad.transpose(0, 1)} if with_positions else {}
    with torch.no_grad():
        logits = model(input_ids=ids_rmpad, use_cache=False, **kwargs).logits.squeeze(0)
    # labels: the next token of the same row, as the padded path's roll gives them
    labels = torch.roll(ids, shifts=-1, dims=1).flatten()[indices]
    return verl_F.logprobs_from_logits(logits, labels), verl_F.entropy_from_logits(logits)


def test_packed_rows_under_sdpa_match_the_padded_batch(model):
    ids, mask, positions = padded_batch(model.config.vocab_size)
    logp_padded, ent_padded = padded_outputs(model, ids, mask, positions)
    logp_packed, ent_packed = packed_outputs(model, ids, mask, positions)
    assert logp_packed.shape == logp_padded.shape == (sum(n for _, n in LENGTHS),)
    diff = (logp_packed - logp_padded).abs().max().item()
    assert diff < TOLERANCE, f"log-probs differ by {diff:.2e}"
    assert (ent_packed - ent_padded).abs().max().item() < TOLERANCE
    logp_leaky, _ = packed_outputs(model, ids, mask, positions, with_positions=False)
    assert (logp_leaky - logp_padded).abs()[LENGTHS[0][1] :].max().item() > 100 * TOLERANCE
