"""Packed windows' structure: `Batch` (what the trainer, validation and eval read) and `Marked` documents.

A packed window of seq_len + 1 tokens is three rows (what `Packer.next_window` returns, (3, seq_len + 1) int32):

    TOKENS  the token ids; inputs are window[:-1], targets window[1:]
    DOCS    the document ordinal of each token within the window: 0 for the document the window starts in (which may
            have begun in an earlier window), +1 at each document start; a document's EOS belongs to it
    MARKS   1 where the token counts in the loss when data.loss_on=marked (a source marks e.g. a synthetic task's
            answers; an unmarked source's tokens all count), else 0

`Batch` keeps only what the data config asks for, so a run with doc_mask=false and loss_on=all sees exactly the
tokens tensor and runs exactly the code it ran before these fields existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

TOKENS, DOCS, MARKS = 0, 1, 2  # rows of a packed window


class Marked(str):
    """A text document with spans that do not count in the loss (data.loss_on=marked): the text itself, plus `parts`,
    its consecutive (text, counts) segments. The packer tokenizes each segment on its own and marks its tokens;
    everything else reads it as the plain text it is. Segments should start at a word boundary (before a space),
    where a byte-level BPE splits anyway, so the tokens equal those of the whole text."""

    parts: tuple

    def __new__(cls, parts: list[tuple[str, bool]]) -> Marked:
        doc = super().__new__(cls, "".join(text for text, _ in parts))
        doc.parts = tuple((text, bool(counts)) for text, counts in parts)
        return doc

    def __reduce__(self):
        return Marked, (list(self.parts),)


@dataclass
class Batch:
    """tokens (B, T+1) int64; doc_ids (B, T+1) int64 when data.doc_mask; loss_mask (B, T+1) bool when
    data.loss_on=marked (position i: token i counts as a target); restart_positions as data.restart_positions."""

    tokens: torch.Tensor
    doc_ids: Optional[torch.Tensor] = None
    loss_mask: Optional[torch.Tensor] = None
    restart_positions: bool = False

    @classmethod
    def from_windows(cls, windows: np.ndarray, cfg, pin: bool = False) -> Batch:
        """windows (B, 3, T+1) int32 packed windows -> the Batch that data config `cfg` asks for. pin: its tensors in
        pinned (page-locked) host memory, which a CUDA device copies from without the host waiting (`to(device,
        non_blocking=True)`); only where CUDA is there (pinning needs it)."""
        w = torch.from_numpy(np.ascontiguousarray(windows))
        if pin:  # each field written once, straight into pinned memory
            field = lambda row, dtype: torch.empty(w[:, row].shape, dtype=dtype, pin_memory=True).copy_(w[:, row])  # noqa: E731
            return cls(
                tokens=field(TOKENS, torch.long),
                doc_ids=field(DOCS, torch.long) if cfg.doc_mask else None,
                loss_mask=field(MARKS, torch.bool) if cfg.loss_on == "marked" else None,
                restart_positions=cfg.restart_positions,
            )
        w = w.long()
        return cls(
            tokens=w[:, TOKENS].contiguous(),
            doc_ids=w[:, DOCS].contiguous() if cfg.doc_mask else None,
            loss_mask=w[:, MARKS].bool() if cfg.loss_on == "marked" else None,
            restart_positions=cfg.restart_positions,
        )

    def to(self, device, non_blocking: bool = False) -> Batch:
        """The Batch on `device`. non_blocking: the host does not wait for the copy (from pinned memory; the device
        orders it before the kernels that read it)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(move(self.tokens), move(self.doc_ids), move(self.loss_mask), self.restart_positions)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def inputs(self) -> torch.Tensor:
        return self.tokens[:, :-1]  # (B, T)

    @property
    def targets(self) -> torch.Tensor:
        return self.tokens[:, 1:]  # (B, T)

    @property
    def target_mask(self) -> Optional[torch.Tensor]:
        """(B, T) bool: the targets that count in the loss; None: all of them."""
        return None if self.loss_mask is None else self.loss_mask[:, 1:]

    def model_kwargs(self) -> dict:
        """What DecoderLM.forward takes beside the inputs: {} without document masks (today's call, unchanged)."""
        if self.doc_ids is None:
            return {}
        return {"doc_ids": self.doc_ids[:, :-1], "restart_positions": self.restart_positions}

    def loss_tokens(self) -> int:
        """Targets that count in the loss (with a loss mask on a device, reading it waits for the device: the
        training step adds `loss_token_count()` up on the device instead)."""
        return int(self.loss_token_count())

    def loss_token_count(self) -> torch.Tensor | int:
        """Targets that count in the loss, without a host sync: a 0-dim tensor on the batch's device when a loss mask
        decides, else the host's count of targets."""
        mask = self.target_mask
        return self.targets.numel() if mask is None else mask.sum()
