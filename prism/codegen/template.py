"""One C source for every value of a graph's symbolic dims in a guard region (a *template*).

``trace(graph, params, dims, isa)`` runs the concrete pipeline -- ``Graph.instantiate`` and
:func:`prism.codegen.kernel.generate` -- with the dims given as :class:`prism.ir.traced.Traced` ints: the
text it prints is the code of those values, with every printed int that depends on them left as a hole,
and every decision taken on them recorded as a guard (prism/ir/traced.py). The template's C source
replaces each hole by its C expression over runtime dims, computed once per function into constant
locals; the entry point reads the dims' values after the input and output pointers in ``io``
(``io[nin + nout + j]``, the dims in sorted name order) into file-scope variables, which each function
copies (one call at a time: a mutex).

A template is only used after :meth:`Template.validate`: at other values of its guard region, plain code
generation must print exactly the template's text with the holes filled in (a value that escaped the
trace -- ``%d``, ``range``, indexing, C functions read an int subclass's value directly -- stays a literal
and the texts differ); a dim that no validation point varied is then pinned. Whoever binds it to a value
checks the compiled kernel numerically (the SuperKernel: at the first ``api.TEMPLATE_CHECKS`` values of
each template).

Measured need: decode attention has one new KV length per token; compiling it per length took 0.28 s of
gcc per token (llama-small bf16 decoded 2.6 tokens/s past the lengths seen, eager 99.8).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prism.codegen import isa as ISA_
from prism.codegen.kernel import Generated, generate
from prism.codegen.loops import rows_vary
from prism.codegen.prelude import prelude
from prism.errors import PrismError
from prism.ir.dims import resolve_params
from prism.ir.graph import Graph
from prism.ir.node import interning_scope
from prism.ir.traced import HOLE_CLOSE, HOLE_OPEN, Lin, Trace, c_name, lin_c, lin_eval, lin_of, lin_var

_HOLE = re.compile(f"{HOLE_OPEN}(\\d+){HOLE_CLOSE}")
ENTRY = "int prism_entry(void** io, float* ws, int nth)"
VALIDATION_POINTS = 2   # other values of the guard region generated plainly and compared (at least dims + 1)


_FUNCTION = re.compile(r"^(?:PR_NOINLINE |PR_INLINE |static )?[A-Za-z_][\w ]*\*? ?\w+\([^;{}]*\) \{$", re.M)


def _global(dim: str) -> str:
    return f"{c_name(dim)}_g"


class TemplateError(PrismError):
    """The graph's code cannot be written once for a region of its dims (it is generated per value)."""


@dataclass
class Template:
    """A traced generation: the text with holes, the guards, and the sizes as expressions of the dims."""

    trace: Trace
    marked: Generated                      # source/body with holes; sizes are (Traced) ints
    dims: tuple[str, ...]                  # runtime dims, in io order
    output_shapes: tuple[tuple[Lin, ...], ...]
    ws_floats: Lin
    scratch_floats: Lin
    checks: list[Any] = dataclasses.field(default_factory=list)   # numeric checks passed at served values
    record_key: str | None = None   # the compiled template's kernel-cache key: its check record's name (api.py)
    records_read: bool = False      # the check record was read (once per template and process)
    first: Any = None      # the runtime's first variant of it (whose workspace the others share)

    def holds(self, env: Mapping[str, int]) -> bool:
        return self.trace.holds(env)

    def render(self, env: Mapping[str, int]) -> str:
        """The template's text with every hole filled in at ``env``: plain generation's text there."""
        return _HOLE.sub(lambda m: str(lin_eval(self.trace.holes[int(m.group(1))], env)), self.marked.source)

    def source(self) -> str:
        """The compilable C: holes as expressions over the runtime dims, an entry point that reads them."""
        nio = len(self.marked.input_names) + len(self.marked.output_names)
        body = _HOLE.sub(lambda m: f"pr_h{m.group(1)}", self.marked.body)
        if body.count(ENTRY) != 1:
            raise TemplateError("the generated text has no single entry point to wrap")
        body = body.replace(ENTRY, "static int prism_entry_body(void** io, float* ws, int nth)")
        # each function computes the holes once, into constant locals, from constant copies of the dims:
        # the file-scope dims may change (for the compiler) at any store through a char or uint16 pointer,
        # and a hole's expression inside a loop kept the loop scalar (decode attention at KV length 2047:
        # 160 us against 80 for the per-length kernel, its exp loop not vectorized)
        local = [f"  const long {c_name(d)} = {_global(d)}; (void){c_name(d)};" for d in self.dims]
        local += [f"  const long pr_h{i} = {lin_c(h)}; (void)pr_h{i};" for i, h in enumerate(self.trace.holes)]
        body = _FUNCTION.sub(lambda m: m.group(0) + "\n" + "\n".join(local), body)
        head = ["/* prism template: the sizes below are expressions of runtime dims (codegen/template.py) */",
                "#include <pthread.h>",
                *[f"static long {_global(d)};" for d in self.dims],
                "static pthread_mutex_t pr_dims_lock = PTHREAD_MUTEX_INITIALIZER;",
                "PR_INLINE long pr_fdiv(long a, long b) { long q = a / b; return (a % b != 0 && ((a < 0) != (b < 0)))"
                " ? q - 1 : q; }", ""]
        entry = [f"{ENTRY} {{", "  pthread_mutex_lock(&pr_dims_lock);",
                 *[f"  {_global(d)} = (long)(intptr_t)io[{nio + j}];" for j, d in enumerate(self.dims)],
                 "  const int rc = prism_entry_body(io, ws, nth);", "  pthread_mutex_unlock(&pr_dims_lock);",
                 "  return rc;", "}", ""]
        return prelude() + "\n" + "\n".join(head) + body + "\n" + "\n".join(entry)

    def bind(self, env: Mapping[str, int], source: str) -> Generated:
        """What the runtime needs to call the compiled template at ``env`` (``source``: its C text)."""
        return dataclasses.replace(
            self.marked, source=source, body=source,
            output_shapes=tuple(tuple(lin_eval(d, env) for d in s) for s in self.output_shapes),
            ws_floats=lin_eval(self.ws_floats, env), scratch_floats=lin_eval(self.scratch_floats, env))

    def words(self, env: Mapping[str, int]) -> tuple[int, ...]:
        """The dims' values as the entry point reads them after the io pointers."""
        return tuple(int(env[d]) for d in self.dims)

    def validate(self, graph: Graph, params: Mapping[str, Any], isa: ISA_.ISA,
                 points: int = VALIDATION_POINTS) -> list[dict[str, int]]:
        """Generate plainly at ``points`` other values of the guard region and compare with the filled-in
        text; returns the values compared. Raises TemplateError on a difference or when the region has no
        other value near the traced one (then the template would serve one value: nothing gained)."""
        others = region_points(self.trace, points)
        if not others:
            raise TemplateError(f"the guard region of {self.trace.env} has no other value nearby")
        for env in others:
            plain = plain_source(graph, params, env, isa)
            if plain != self.render(env):
                raise TemplateError(f"the text traced at {self.trace.env} differs from plain generation at {env} "
                                    "(a size escaped the trace)")
        base = self.trace.env
        for d in base:   # a dim no validation point varied is pinned: the template serves only what was shown
            if all(env[d] == base[d] for env in others):
                self.trace.pin(lin_var(d), base[d])
        return others


def plain_source(graph: Graph, params: Mapping[str, Any], env: Mapping[str, int], isa: ISA_.ISA) -> str:
    """The C that generation writes at ``env`` the way templates are generated (``loops.rows_vary``), with every
    size printed as its value: the text a template's rendering at ``env`` must equal. The dims are traced here
    too (and the holes filled in at ``env``), so that choices made on whether a size varies
    (``traced.varies``: a structural fact) are the template's; every value is that of ``env``, so a size that
    escaped the template's trace (a literal there) still differs."""
    tr, gen = _traced(graph, params, env, isa)
    return _HOLE.sub(lambda m: str(lin_eval(tr.holes[int(m.group(1))], env)), gen.source)


def _traced(graph: Graph, params: Mapping[str, Any], dims: Mapping[str, int], isa: ISA_.ISA) -> tuple[Trace, Generated]:
    tr = Trace(dims)
    with interning_scope(tr), rows_vary():
        dims_t = tr.dims()
        g = graph.instantiate({**dims_t, **resolve_params(params, dims_t)})   # a Follows parameter is traced too
        return tr, generate(g, isa)


def trace(graph: Graph, params: Mapping[str, Any], dims: Mapping[str, int], isa: ISA_.ISA) -> Template:
    """Generate ``graph`` at ``dims`` (its symbolic dims) and ``params`` with the dims traced (and the products'
    row groups independent of their row counts: ``loops.rows_vary``)."""
    tr, gen = _traced(graph, params, dims, isa)
    if not tr.holes:
        raise TemplateError("no printed size depends on the dims")
    if tr.specialized():
        raise TemplateError("a decision pins a dim to its value")
    return Template(tr, gen, tuple(sorted(dims)), tuple(tuple(lin_of(d, tr) for d in s) for s in gen.output_shapes),
                    lin_of(gen.ws_floats, tr), lin_of(gen.scratch_floats, tr))


def region_points(tr: Trace, count: int) -> list[dict[str, int]]:
    """Up to ``count`` values of the dims other than the traced ones where every guard holds: per dim, the
    nearest above with the others kept; then all dims about 2x and 4x. A size that escaped the trace is a
    literal in the template, so it shows at a value where it differs."""
    base = tr.env
    found: list[dict[str, int]] = []

    def first(make: Any) -> None:
        for k in range(1, 129):
            env = make(k)
            if env != base and env not in found and tr.holds(env):
                found.append(env)
                return
    for d in sorted(base):
        first(lambda k, d=d: {**base, d: base[d] + k})
    for scale in (2, 4):
        first(lambda k, scale=scale: {x: v * scale + k for x, v in base.items()})
    return found[:max(count, len(base) + 1)]


def check_points(tr: Trace, env: Mapping[str, int], count: int, skip: list[dict[str, int]]) -> list[dict[str, int]]:
    """Up to ``count`` values of a one-dim template's guard region below the served value ``env``: cheaper
    places than ``env`` to check the template's compiled code numerically (the SuperKernel's TEMPLATE_CHECKS):
    the region's smallest value, then the smallest from a quarter of ``env`` whose three low bits are set where
    the region has one within 8 (a row remainder that takes every run of ``matmul.REM_RUNS``, and a 4-row
    tail), then the smallest from half of ``env``, then the region's next smallest -- distinct, not in ``skip``.
    The code is the same at every value of the region (``validate``: plain generation's text); a check shows the
    arithmetic of that text and its sizes at one value. Empty for a template over several dims."""
    if len(tr.env) != 1 or set(env) != set(tr.env):
        return []
    ((d, top),) = env.items()
    out: list[dict[str, int]] = []

    def first(lo: int, hi: int, odd: bool = False) -> int | None:
        return next((v for v in range(max(1, lo), min(hi, top)) if (not odd or v % 8 == 7)
                     and {d: v} not in out and {d: v} not in skip and tr.holds({d: v})), None)
    for i, start in enumerate((1, top // 4, top // 2)):
        v = first(start, top)
        if v is not None and i == 1:
            v = first(v, v + 8, odd=True) or v
        if v is not None:
            out.append({d: v})
        if len(out) >= count:
            break
    # a short region (its values all below a quarter of ``env``): its next smallest values. Measured need: the
    # pre-build's tail kernel at 2 rows (a template for 2-15 rows, checked below a 64-row tile) found one value
    # and was left unchecked; llama-1b bf16's 13-row tail at prompt 141 then ran two checks that drew the fused
    # MLP's weights again (0.39 s)
    while len(out) < count and (v := first(1, top)) is not None:
        out.append({d: v})
    return out[:count]
