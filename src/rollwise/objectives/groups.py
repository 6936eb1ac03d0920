"""Per-group statistics on ragged groups, by index operations (docs/architecture.md §1).

Rows of a batch belong to groups through ``group_index`` (B,) long. Group ids may be any
integers: not contiguous, not sorted, groups of any size. Nothing here reshapes by a global
group size ``n``; every statistic is computed with ``torch.unique(return_inverse=True)`` and
``index_add_`` / ``scatter_reduce_``, then gathered back to rows.

Every function returns a per-*row* tensor (B,): the statistic of the row's group. This is the
one place where group means, standard deviations, counts, medians and "all rewards equal"
flags are computed; advantage estimators compose them and never repeat the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Groups:
    """Dense group labels for a batch: ``inverse[i]`` in ``0..num-1`` is row i's group."""

    inverse: torch.Tensor  # (B,) long, dense group label per row
    num: int  # number of distinct groups

    @classmethod
    def of(cls, group_index: torch.Tensor) -> Groups:
        if group_index.dim() != 1:
            raise ValueError(f"group_index must be 1-D (B,), got shape {tuple(group_index.shape)}")
        _, inverse = torch.unique(group_index, return_inverse=True)
        num = int(inverse.max().item()) + 1 if inverse.numel() else 0
        return cls(inverse.long(), num)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """(B,) -> (B,): sum of ``x`` over the row's group."""
        out = torch.zeros(self.num, dtype=x.dtype, device=x.device).index_add_(0, self.inverse, x)
        return out[self.inverse]

    def count(self, like: torch.Tensor) -> torch.Tensor:
        """(B,): size of the row's group, in ``like``'s dtype."""
        return self.sum(torch.ones_like(like))

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return self.sum(x) / self.count(x)

    def std(self, x: torch.Tensor, unbiased: bool) -> torch.Tensor:
        """Group standard deviation; with ``unbiased`` a group of one row gets NaN (0/0), as
        ``torch.std`` does. Callers decide what a singleton means."""
        n = self.count(x)
        centred = x - self.mean(x)
        ss = self.sum(centred * centred)
        return (ss / (n - 1 if unbiased else n)).sqrt()

    def _reduce(self, x: torch.Tensor, how: str) -> torch.Tensor:
        out = torch.zeros(self.num, dtype=x.dtype, device=x.device)
        out = out.scatter_reduce(0, self.inverse, x, reduce=how, include_self=False)
        return out[self.inverse]

    def max(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(x, "amax")

    def min(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(x, "amin")

    def constant(self, x: torch.Tensor) -> torch.Tensor:
        """(B,) bool: the row's group has all values equal (exactly), e.g. all-correct rewards.
        Estimators force such rows to advantage 0 so float round-off in the mean cannot leak."""
        return self.max(x) == self.min(x)

    def lower_median(self, x: torch.Tensor) -> torch.Tensor:
        """(B,): the row's group median; for an even group size the lower of the two middle
        values (``torch.median``'s convention), so the median is always one of the values."""
        # Sort rows by (group, value): stable sort by value, then stable sort by group.
        by_value = torch.sort(x, stable=True).indices
        order = by_value[torch.sort(self.inverse[by_value], stable=True).indices]
        counts = torch.bincount(self.inverse, minlength=self.num)
        starts = torch.cumsum(counts, 0) - counts
        med = x[order[starts + (counts - 1) // 2]]  # (num,)
        return med[self.inverse]

    def first_row_where(self, cond: torch.Tensor) -> torch.Tensor:
        """(B,) bool: True on the lowest-index row of each group where ``cond`` holds."""
        rows = torch.arange(cond.numel(), device=cond.device)
        big = torch.full_like(rows, cond.numel())
        first = self._reduce(torch.where(cond, rows, big), "amin")
        return cond & (rows == first)
