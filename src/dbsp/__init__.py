"""dbsp: incremental view maintenance (DBSP) for Python."""

__version__ = "0.1.0"

from .algebra.schema import WEIGHT, InputError  # noqa: E402
from .circuit.circuit import Circuit, CircuitError  # noqa: E402
from .trace.batch import OrdIndexedZSet, OrdZSet, ZSet  # noqa: E402

from .api import (StreamContext, coalesce, col, count, hopping, lit, session,  # noqa: E402
                  sum_, tumbling, when)

__all__ = ["Circuit", "CircuitError", "InputError", "WEIGHT", "ZSet", "OrdZSet", "OrdIndexedZSet",
           "StreamContext", "col", "lit", "when", "coalesce", "count", "sum_", "tumbling",
           "hopping", "session"]
