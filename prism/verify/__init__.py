"""Equivalence verification: an e-graph proof over the parallel term language (egglog), backed by
numeric testing. See docs/verify.md.

``prism.verify`` is this package and, called, the function :func:`verify`: ``prism.verify(candidate,
reference)`` and ``import prism.verify.egraph`` both work (the package's class is a callable module type;
a function exported under the package's name hid the package from ``import prism.verify.x as y``).
"""


from prism._callable import make_callable
from prism.verify.api import VerifyResult, verify
from prism.verify.egraph import FormalResult, Limits, ProofStats, prove
from prism.verify.numeric import (
                                  NumericResult,
                                  Runner,
                                  choose_instantiations,
                                  compiled_runner,
                                  interpreter_runner,
                                  numeric_check,
)

__all__ = ["FormalResult", "Limits", "NumericResult", "ProofStats", "Runner", "VerifyResult", "choose_instantiations",
           "compiled_runner", "interpreter_runner", "numeric_check", "prove", "verify"]


make_callable(__name__, verify)
