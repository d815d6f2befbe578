"""Noise drawn as if for the whole run at once, handed out one row at a time.

The simulator draws each noise array of the run in one call, ``rng.standard_normal((gpus,
samples))``, one after the other from one generator. A generator fills such an array row by
row from its stream, so row ``i`` is what the stream gives after rows ``0…i-1``. `RowDraws`
walks the stream once through every draw, keeping the generator's state at the start of each
row (a few hundred bytes each; the numbers themselves are thrown away), and then positions a
generator at the start of any row on demand. The simulator can so generate and write one GPU
(or one host) at a time and still produce, for a seed, exactly the numbers the whole-run draw
gave: memory holds one row, not the run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_CHUNK = 1 << 20
"""Numbers drawn per call while skipping a row: bounds the scratch buffer (8 MB)."""


class RowDraws:
    """Positions in one generator's stream: the start of each row of a sequence of draws.

    ``draws`` lists the draws in the order the stream makes them: ``(kind, row_lengths)`` with
    ``kind`` ``"normal"`` (`Generator.standard_normal`) or ``"uniform"`` (`Generator.random`).
    Building it advances ``rng`` past every draw, as the draws themselves would have.
    """

    def __init__(self, rng: np.random.Generator, draws: Sequence[tuple[str, Sequence[int]]]):
        self._bitgen_type = type(rng.bit_generator)
        self.kinds = [kind for kind, _ in draws]
        self.starts: list[list[dict]] = []
        longest = max((max(rows, default=0) for _, rows in draws), default=0)
        buf = np.empty(min(max(longest, 1), _CHUNK))
        for kind, rows in draws:
            fill = rng.standard_normal if kind == "normal" else rng.random
            if kind not in ("normal", "uniform"):
                raise ValueError(f"unknown draw kind {kind!r}")
            starts = []
            for length in rows:
                starts.append(rng.bit_generator.state)
                left = int(length)
                while left > 0:
                    k = min(left, len(buf))
                    fill(out=buf[:k])
                    left -= k
            self.starts.append(starts)

    def at(self, draw: int, row: int) -> np.random.Generator:
        """A generator at the start of ``row`` of ``draw``: drawing from it gives that row's
        numbers, then the next row's, as the whole draw had them."""
        gen = np.random.Generator(self._bitgen_type())
        gen.bit_generator.state = self.starts[draw][row]
        return gen

    def row(self, draw: int, row: int, length: int) -> np.ndarray:
        """The ``length`` numbers of ``row`` of ``draw``."""
        gen = self.at(draw, row)
        if self.kinds[draw] == "normal":
            return gen.standard_normal(length)
        return gen.random(length)
