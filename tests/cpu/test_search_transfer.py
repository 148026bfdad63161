"""One search serves every size of its program (``prism.search.transfer``): a program searched before serves
another of its family with its candidates at the new sizes, each verified again; a candidate that does not
verify there is not served, a damaged family file is rebuilt, ``PRISM_SEARCH_TRANSFER=0`` turns it off."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from search_programs import grouped_linear
from torch import nn

import prism
from prism.api import clear_memory_caches
from prism.errors import CacheWarning
from prism.runtime import store
from prism.search import Limits, driver
from prism.search.gate import verify as gate_verify
from prism.search.transfer import family, narrows, size_map
from prism.tune import STATS, reset_stats

pytestmark = pytest.mark.cpu

LIMITS = Limits(max_kernel_ops=1, time_limit=30, max_results=2)


def rms_linear(d: int, m: int, eps: float = 1e-6) -> prism.Graph:
    g = prism.Graph("transfer_rms_linear")
    X, W = g.input("X", ("n", d)), g.input("W", (d, m))
    g.output(g.matmul(g.rms_norm(X, eps=eps), W), "Y")
    return g


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    from prism.runtime import cache
    cache._LOADED.clear()
    clear_memory_caches()
    monkeypatch.setenv("PRISM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PRISM_SEARCH_TRANSFER", raising=False)
    yield tmp_path / "cache"
    clear_memory_caches()


def sizes(donor: prism.Graph, program: prism.Graph) -> dict[int, tuple[int, ...]] | None:
    return size_map(family(donor), family(program))


def test_family_and_the_size_map() -> None:
    """Sizes above 1 are placeholders; each size of the donor maps to the program's sizes at its places."""
    assert family(rms_linear(64, 32))[0] == family(rms_linear(96, 48))[0]
    assert sizes(rms_linear(64, 32), rms_linear(96, 48)) == {64: (96,), 32: (48,)}
    assert sizes(rms_linear(64, 32), rms_linear(48, 48)) == {64: (48,), 32: (48,)}   # two sizes become one
    assert sizes(rms_linear(48, 48), rms_linear(64, 32)) == {48: (64, 32)}          # one becomes two
    assert sizes(rms_linear(64, 32), rms_linear(64, 32)) == {64: (64,), 32: (32,)}
    assert sizes(rms_linear(64, 32), rms_linear(64, 32, eps=1e-5)) is None           # a constant differs
    assert sizes(rms_linear(64, 32), rms_linear(64, 4)) == {64: (64,), 32: (4,)}
    assert sizes(rms_linear(64, 32), rms_linear(64, 1)) is None                      # 1 broadcasts: literal


def test_a_search_serves_another_size_of_its_program(fresh_cache: Path) -> None:
    """The transferred candidates are the program's own search's structures, at its sizes, each verified
    against it; the result is cached as the program's own."""
    donor = driver.search(rms_linear(64, 32), LIMITS, env={"n": 8})
    assert donor.candidates and not donor.transferred_from
    g = rms_linear(96, 48)
    got = driver.search(g, LIMITS, env={"n": 8}, transfer=True)
    assert got.transferred_from == donor.program.key and got.candidates
    own = driver.search(g, LIMITS, env={"n": 8}, cache=False)
    assert {c.structure for c in got.candidates} == {c.structure for c in own.candidates}
    for c in got.candidates:
        assert [tuple(map(str, n.shape)) for n in c.graph.inputs.values()] == [("n", "96"), ("96", "48")]
        assert c.verdict.ok and gate_verify(c.graph, g).ok
    again = driver.search(g, LIMITS, env={"n": 8}, transfer=True)
    assert again.cached and again.transferred_from == donor.program.key
    # without transfer a program of the family is searched
    alone = driver.search(rms_linear(80, 40), LIMITS, env={"n": 8})
    assert not alone.transferred_from and not alone.cached


def _edit_eps(entry: Path) -> None:
    """Change the rms epsilon of the entry's candidates (not its program), the checksum made valid again."""
    d = json.loads(entry.read_text())

    def walk(x: object) -> object:
        if isinstance(x, float) and x == 1e-06:
            return 2e-06
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return x
    for c in d["payload"]["candidates"]:
        c["graph"] = walk(c["graph"])
    d["sha256"] = store.digest(d["payload"])
    entry.write_text(json.dumps(d))


def test_a_candidate_that_does_not_verify_at_the_new_sizes_is_not_served(fresh_cache: Path) -> None:
    """The donor's entry edited consistently (its candidates compute another epsilon): none verifies against
    the new program, which is then searched."""
    driver.search(rms_linear(64, 32), LIMITS, env={"n": 8})
    (entry,) = sorted((fresh_cache / "search").glob("*.json"))
    _edit_eps(entry)
    g = rms_linear(96, 48)
    got = driver.search(g, LIMITS, env={"n": 8}, transfer=True)
    assert not got.transferred_from and not got.cached and got.candidates
    for c in got.candidates:
        assert gate_verify(c.graph, g).ok


def test_a_damaged_family_file_is_rebuilt(fresh_cache: Path) -> None:
    driver.search(rms_linear(64, 32), LIMITS, env={"n": 8})
    fams = sorted((fresh_cache / "search" / "family").glob("*.json"))
    assert len(fams) == 2   # its family's file and its wide family's (transfer.family(..., wide=True))
    for fam in fams:
        fam.write_bytes(b"{not json")
    with pytest.warns(CacheWarning, match="corrupt"):
        got = driver.search(rms_linear(96, 48), LIMITS, env={"n": 8}, transfer=True)
    assert not got.transferred_from and got.candidates
    for fam in fams:   # the new search is its families' donor now
        assert store.load(fam, "search-family").payload is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert driver.search(rms_linear(80, 40), LIMITS, env={"n": 8}, transfer=True).transferred_from


@pytest.mark.parametrize("on", [True, False])
def test_superoptimize_transfers_unless_turned_off(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                   on: bool) -> None:
    if not on:
        monkeypatch.setenv("PRISM_SEARCH_TRANSFER", "0")
    reset_stats()
    prism.superoptimize(rms_linear(64, 32), limits=LIMITS, measure_machine=False)
    g = rms_linear(96, 48)
    k = prism.superoptimize(g, limits=LIMITS, measure_machine=False)
    assert (STATS.searches, STATS.search_transfers) == ((1, 1) if on else (2, 0))
    rng = np.random.default_rng(0)
    x = {"X": rng.standard_normal((5, 96), dtype=np.float32), "W": rng.standard_normal((96, 48), dtype=np.float32)}
    ref = g.evaluate({k: v.astype(np.float64) for k, v in x.items()}, dtype=np.float64)["Y"]
    np.testing.assert_allclose(k(**x), ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_model_layers_of_other_shapes_share_one_search(fresh_cache: Path) -> None:
    """Through the frontend: two Linear layers of different weight shapes, searched once."""
    torch.manual_seed(0)
    reset_stats()
    for k_in, n_out in ((64, 96), (96, 40)):
        lin = nn.Linear(k_in, n_out)
        x = torch.randn(3, k_in)
        with torch.no_grad():
            o = prism.optimize(lin, (x,))
            y = o(x)
        (rep,) = o.report
        assert all(p.by_prism for p in rep.pieces), o.explain()
        ref = x.double() @ lin.weight.detach().double().t() + lin.bias.detach().double()
        np.testing.assert_allclose(y.double().numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)
    assert (STATS.searches, STATS.search_transfers) == (1, 1)


def test_a_donor_with_equal_sizes_serves_a_program_where_they_differ(fresh_cache: Path) -> None:
    """[256, 256] serves [96, 256]: the donor's 256 stands for two sizes, and each of its candidates' reshapes
    takes the one that keeps the graph consistent (the weight's [256, 8, 32] becomes [96, 8, 32])."""
    assert sizes(grouped_linear(256, 256), grouped_linear(96, 256)) == {256: (256, 96), 8: (8,), 32: (32,)}
    donor = driver.search(grouped_linear(256, 256), LIMITS, env={"n": 8})
    g = grouped_linear(96, 256)
    got = driver.search(g, LIMITS, env={"n": 8}, transfer=True)
    assert donor.candidates and got.transferred_from == donor.program.key and got.candidates
    rng = np.random.default_rng(0)
    x = {"x": rng.standard_normal((3, 256)).astype(np.float32),
         "q": rng.integers(-127, 128, (96, 256)).astype(np.int8),
         "s": rng.uniform(1e-3, 1e-1, (96, 8)).astype(np.float32)}
    ref = g.evaluate(x, dtype=np.float64)["y"]
    for c in got.candidates:
        assert gate_verify(c.graph, g).ok
        params = {s: 1 for bg in c.graph.customized_ops() for s in bg.symbols() - bg.map_symbols() - {"n"}}
        for k in sorted(params):   # each grid size and loop range at 2 in turn (every divisor of 96 and 8 is)
            out = c.graph.evaluate(x, dtype=np.float64, params={**params, k: 2})
            np.testing.assert_allclose(out["y"], ref, rtol=1e-9, atol=1e-9 * float(np.abs(ref).max()))


def rows_linear(rows: int, d: int = 64, m: int = 48) -> prism.Graph:
    """A decode step's Linear: fixed rows, as Dynamo's static graphs give them (one row in decode)."""
    g = prism.Graph("transfer_rows_linear")
    X, W = g.input("X", (1, rows, d)), g.input("W", (m, d))
    g.output(g.matmul(g.rms_norm(X, eps=1e-6), g.permute(W, (1, 0))), "Y")
    return g


def test_the_wide_family_narrows_only() -> None:
    """Sizes of 1 are placeholders in the wide family; it serves a program only by narrowing sizes to 1."""
    assert family(rows_linear(1))[0] != family(rows_linear(16))[0]
    wide = size_map(family(rows_linear(16), wide=True), family(rows_linear(1), wide=True))
    assert wide == {1: (1,), 16: (1,), 64: (64,), 48: (48,)}
    assert narrows(wide)
    back = size_map(family(rows_linear(1), wide=True), family(rows_linear(16), wide=True))
    assert back is not None and not narrows(back)          # one row's search does not serve more rows
    same = size_map(family(rows_linear(16), wide=True), family(rows_linear(24), wide=True))
    assert same is not None and not narrows(same)          # nothing narrowed: the plain family's case


def test_a_one_row_program_takes_the_many_row_search(fresh_cache: Path) -> None:
    donor = driver.search(rows_linear(16), LIMITS, transfer=True)
    assert not donor.transferred_from and donor.candidates
    got = driver.search(rows_linear(1), LIMITS, transfer=True)
    assert got.transferred_from == rows_linear(16).key and got.candidates
    for c in got.candidates:   # rebuilt at one row and verified against the one-row program itself
        assert c.graph.inputs["X"].shape == (1, 1, 64)
        assert c.verdict.ok and c.verdict.how == "formal+numeric"
        assert gate_verify(c.graph, rows_linear(1)).ok


def test_a_one_row_search_does_not_serve_more_rows(fresh_cache: Path) -> None:
    assert not driver.search(rows_linear(1), LIMITS, transfer=True).transferred_from
    assert not driver.search(rows_linear(16), LIMITS, transfer=True).transferred_from   # searched: widening


def rms_linear_rows(n: object, d: int, m: int) -> prism.Graph:
    g = prism.Graph("transfer_rms_linear")
    X, W = g.input("X", (n, d)), g.input("W", (d, m))
    g.output(g.matmul(g.rms_norm(X), W), "Y")
    return g


def test_the_fixed_family_of_a_symbolic_program() -> None:
    """With ``symbols=True`` symbolic dims are placeholders too: a program at fixed sizes maps onto the symbolic
    one (each fixed size to the symbols or sizes at its places); a symbolic donor maps onto nothing."""
    sym = rms_linear_rows("n", 64, 32)
    n = sym.inputs["X"].shape[0]
    assert family(sym)[0] != family(rms_linear_rows(24, 64, 32))[0]
    assert family(sym, symbols=True)[0] == family(rms_linear_rows(24, 64, 32))[0]
    got = size_map(family(rms_linear_rows(24, 64, 32)), family(sym, symbols=True))
    assert got is not None and got[64] == (64,) and got[32] == (32,) and got[24] == (n,)
    both = size_map(family(rms_linear_rows(64, 64, 32)), family(sym, symbols=True))
    assert both is not None and both[64] == (n, 64)   # the rows' size equals a fixed one: two images
    assert size_map(family(sym, symbols=True), family(sym, symbols=True)) is None


@pytest.mark.parametrize("rows", [24, 64])
def test_a_symbolic_program_takes_its_fixed_twins_search(fresh_cache: Path, rows: int) -> None:
    """Dynamo's recompile at a model's first new prompt length: the dynamic graph's pieces are the fixed-shape
    pieces over a symbolic length. Each takes its twin's search (rebuilt over the symbol, verified against the
    symbolic program) where it was searched afresh; the structures are the symbolic search's own."""
    donor = driver.search(rms_linear_rows(rows, 64, 32), LIMITS, transfer=True)
    assert not donor.transferred_from and donor.candidates
    sym = rms_linear_rows("n", 64, 32)
    got = driver.search(sym, LIMITS, env={"n": 8}, transfer=True)
    assert got.transferred_from == donor.program.key and got.candidates
    own = driver.search(sym, LIMITS, env={"n": 8}, cache=False)
    assert {c.structure for c in got.candidates} <= {c.structure for c in own.candidates}
    for c in got.candidates:
        assert [tuple(map(str, n.shape)) for n in c.graph.inputs.values()] == [("n", "64"), ("64", "32")]
        assert c.verdict.ok and gate_verify(c.graph, sym).ok
    # through superoptimize (the frontend's path): transferred, tuned at a length the twin never had, exact
    clear_memory_caches()
    reset_stats()
    k = prism.superoptimize(sym, limits=LIMITS, top_k=2, measure_machine=False)
    assert STATS.search_transfers == 0 and STATS.search_cache_hits == 1   # the transfer above was cached
    x = np.random.default_rng(0).standard_normal((13, 64)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    x64 = x.astype(np.float64)
    ref = (x64 / np.sqrt((x64 ** 2).mean(1, keepdims=True) + 1e-6)) @ w
    np.testing.assert_allclose(np.asarray(k(X=x, W=w), np.float64), ref, rtol=1e-4, atol=1e-4)
