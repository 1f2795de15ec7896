"""Reading the reference trainer's log lines in tests."""

from __future__ import annotations


def train_losses(text: str, rank0_only: bool = False) -> dict[int, float]:
    """Step -> train loss from the trainer's "step N/M | train loss X" lines. In provision's
    node logs torchrun prefixes each line with its rank: ``rank0_only`` keeps rank 0's."""
    out = {}
    for line in text.splitlines():
        if "| train loss" in line and (not rank0_only or "rank0" in line):
            part = line.split("step ", 1)[1]
            out[int(part.split("/")[0])] = float(part.split("train loss ")[1].split()[0])
    return out
