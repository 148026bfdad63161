"""Which instances the tuner measures (``prism.tune.tuner.select``): fake estimates on one real sGraph."""

from __future__ import annotations

import prism
from prism.tune.candidates import Instance
from prism.tune.cost import Estimate, OpCost
from prism.tune.tuner import select


def _source() -> prism.Graph:
    g = prism.Graph()
    x = g.input("x", (4, 8))
    g.output(g.exp(x), "y")
    return g


def _inst(sgraph: int, tag: int, seconds: float, dram: int, blocks: int) -> Instance:
    est = Estimate(seconds, dram, 0, [OpCost("customized", seconds, dram, 0, blocks=blocks)])
    return Instance(sgraph, {"tag": tag}, _source(), {}, est)


def test_the_least_traffic_near_tie_is_measured_too() -> None:
    """A compute-bound block ties every tiling on compute; the ranking then falls to per-block overheads and
    favours tilings that re-stream the weights. The least-traffic instance within SPREAD is measured as well."""
    row_split = [_inst(0, i, 1.000 + i * 1e-4, 1_600_000_000, 64 * (i + 1)) for i in range(6)]
    lean = _inst(0, 99, 1.005, 440_000_000, 256)
    far = _inst(0, 100, 9.0, 1_000_000, 4)            # outside SPREAD: never picked for its traffic
    picked = select(row_split + [lean, far], 4)
    assert lean in picked and far not in picked and len(picked) == 4
    assert picked[0] is row_split[0]                   # still in predicted order, the favourite first


def test_no_extra_pick_when_the_favourites_already_move_least() -> None:
    """The favourite moves the fewest bytes: the picks are the favourite and one per block count, as before."""
    a = [_inst(0, i, 1.0 + i * 1e-3, 100 + i, 8 * (i + 1)) for i in range(6)]
    assert select(a, 4) == select(list(reversed(a)), 4) == a[:4]
