"""Turn validated trajectory records into padded training tensors and score them under a policy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.records import Trajectory


@dataclass
class Batch:
    """Right-padded sequences; completion positions are where ``mask`` is 1.

    input_ids, attention: [B, L]; token_mask: [B, T]; behaviour_logp: [B, T]; rewards: [B];
    group_index: [B]; versions: [B]. ``T = L - 1``: position t scores token t+1.
    """

    input_ids: torch.Tensor
    attention: torch.Tensor
    token_mask: torch.Tensor
    behaviour_logp: torch.Tensor
    rewards: torch.Tensor
    group_index: torch.Tensor
    versions: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: str | torch.device) -> Batch:
        return Batch(**{name: getattr(self, name).to(device) for name in self.__dataclass_fields__})

    def rows(self, start: int, stop: int) -> Batch:
        """Rows ``start:stop``, trimmed to their longest sequence (a causal model ignores the padding)."""
        width = max(int(self.attention[start:stop].sum(dim=1).max()), 2) if stop > start else 2
        out = {}
        for name in self.__dataclass_fields__:
            tensor = getattr(self, name)[start:stop]
            if name in ("input_ids", "attention"):
                tensor = tensor[:, :width]
            elif name in ("token_mask", "behaviour_logp"):
                tensor = tensor[:, : width - 1]
            out[name] = tensor
        return Batch(**out)


def collate(records: list[Trajectory], *, pad_id: int) -> Batch:
    """Pad ``records`` on the right into one batch; groups are numbered in order of first appearance."""
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in records)
    size = len(records)
    input_ids = torch.full((size, width), pad_id, dtype=torch.long)
    attention = torch.zeros((size, width), dtype=torch.long)
    token_mask = torch.zeros((size, width - 1), dtype=torch.float32)
    behaviour = torch.zeros((size, width - 1), dtype=torch.float32)
    groups: dict[str, int] = {}
    for row, rec in enumerate(records):
        seq = rec.prompt_ids + rec.completion_ids
        input_ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        start = len(rec.prompt_ids) - 1  # position predicting the first completion token
        n = len(rec.completion_ids)
        mask = rec.loss_mask if rec.loss_mask is not None else [1] * n
        token_mask[row, start : start + n] = torch.tensor(mask, dtype=torch.float32)
        behaviour[row, start : start + n] = torch.tensor(rec.logprobs, dtype=torch.float32)
        groups.setdefault(rec.group_id, len(groups))
    return Batch(
        input_ids=input_ids,
        attention=attention,
        token_mask=token_mask,
        behaviour_logp=behaviour,
        rewards=torch.tensor([r.reward for r in records], dtype=torch.float32),
        group_index=torch.tensor([groups[r.group_id] for r in records], dtype=torch.long),
        versions=torch.tensor([r.version for r in records], dtype=torch.long),
    )


def token_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Log-prob under ``model`` of each next token: [B, L-1] (meaningful where token_mask is 1)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention).logits[:, :-1, :].float()
    return torch.log_softmax(logits, dim=-1).gather(2, batch.input_ids[:, 1:, None]).squeeze(2)
