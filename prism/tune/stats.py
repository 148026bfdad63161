"""Counters of this process: tests assert on them instead of on timing."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class TuneStats:
    searches: int = 0            # searches run (prism.search calls not answered by its disk cache)
    search_cache_hits: int = 0   # prism.search calls answered from its disk cache
    search_memory_hits: int = 0  # a new shape served by sGraphs already held in memory (no search call)
    search_transfers: int = 0    # prism.search calls answered by another size's search (prism.search.transfer)
    reverifications: int = 0     # prism.verify re-checks of numeric-only search results
    tunings: int = 0             # tuning runs (candidates ranked, compiled and measured)
    tune_cache_hits: int = 0     # tuning results read from the disk cache
    tune_memory_hits: int = 0    # shapes already tuned by this kernel object
    tune_derived: int = 0        # new shapes given a nearby shape's tuned winner, compiled and checked (derive)
    tune_derived_far: int = 0    # ... of them, from a tuning more than api.DERIVE_WINDOW away (recorded as pending)
    tune_split: int = 0          # ... of them, served as calls on ranges of rows (api.SuperKernel._split)
    template_served: int = 0     # derived shapes served by a template already checked at TEMPLATE_CHECKS shapes
    template_checks_recorded: int = 0   # template checks adopted from an earlier process's record (api.py)
    template_checks_below: int = 0   # template checks run at a cheaper value of its region than the served one
    template_prebuilt: int = 0   # shapes one past a tuned one, derived (template built, checked) right after it
    rebuilds: int = 0            # corrupt or stale cache entries that were rebuilt
    machine_measurements: int = 0  # triad/peak measurements (once per machine fingerprint)
    compiles: int = 0            # candidate kernels compiled by the tuner
    compile_failures: int = 0
    compiled_ahead: int = 0      # candidates submitted to the background compiler (tune.ahead) after their search
    ahead_taken: int = 0         # ... of them, taken compiled (or compiling) by their tuning
    prebuilt_later: int = 0      # pre-builds held for the next graph compile (SuperKernel._prebuild, ahead.defer)
    derived_ahead: int = 0       # derivations submitted to the background compiler (SuperKernel._derive_early)
    measured: int = 0            # candidate kernels timed
    wrong_results: int = 0       # candidates whose output did not match the reference
    final_checks: int = 0        # numeric checks of a winner's compiled kernel
    checks_cached: int = 0       # cached tunings whose very kernel passed its check when tuned (not repeated)
    contended_tunings: int = 0   # tunings measured under contention (stored marked; `prism cache retune`)
    contended_served: int = 0    # marked (contended) tuning entries served from the disk cache
    contended_machine: int = 0   # machine measurements taken under contention (not written to disk)

    def to_json(self) -> dict[str, int]:
        return asdict(self)


STATS = TuneStats()


def reset_stats() -> None:
    for f in fields(TuneStats):
        setattr(STATS, f.name, 0)
