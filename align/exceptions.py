"""Typed errors and warnings raised by :mod:`align`.

One small tree, so callers can catch as broadly or as narrowly as they like::

    VecbridgeError                            every error raised on purpose; ``kind`` names its class of
    │                                         failure (read by the service's HTTP-status and exit-code tables)
    ├── InputError (also ValueError)          bad arrays handed to a public function
    │   ├── NonFiniteError                    NaN or Inf in the data
    │   │   └── NotRepresentableError         finite input (or result) float32 cannot hold
    │   ├── ShapeError                        wrong ndim (1-D, 3-D, ...)
    │   ├── DimensionMismatchError            columns differ from what the map/frame expects
    │   ├── EmptyInputError                   zero rows or zero columns
    │   ├── TooFewRowsError                   fewer rows than clusters / pairs / neighbours asked for
    │   ├── DegenerateInputError              rank-deficient data (e.g. all rows identical)
    │   └── PairCountError                    paired arrays with different row counts
    ├── NotFittedError (also AttributeError)  transform/map_ used before fit
    ├── SerializationError                    an artifact that cannot be read back
    └── Cancelled                             a long computation stopped on request (a progress
                                              callback raises it; fits and jobs stop cleanly)

    VecbridgeWarning (UserWarning)
    └── ConvergenceWarning                    an iterative stage stopped early or looks unreliable
"""

from __future__ import annotations

__all__ = [
    "VecbridgeError",
    "InputError",
    "NonFiniteError",
    "NotRepresentableError",
    "ShapeError",
    "DimensionMismatchError",
    "EmptyInputError",
    "TooFewRowsError",
    "DegenerateInputError",
    "PairCountError",
    "NotFittedError",
    "SerializationError",
    "Cancelled",
    "KINDS",
    "VecbridgeWarning",
    "ConvergenceWarning",
]


#: The classes of failure an error can belong to (``VecbridgeError.kind``). The service maps each
#: to one HTTP status and one CLI exit code (``service.errors``); align only names them.
KINDS = ("invalid", "not_found", "conflict", "precondition", "unauthenticated", "forbidden", "too_large",
         "unsupported_media", "timeout", "busy", "unavailable", "cancelled", "integrity", "internal")


class VecbridgeError(Exception):
    """Base class of every error raised on purpose by vecbridge.

    ``kind`` (one of :data:`KINDS`) says what sort of failure it is; subclasses set it once.
    """

    kind: str = "internal"


class InputError(VecbridgeError, ValueError):
    """The input arrays are not usable; the message says what was expected."""

    kind = "invalid"


class NonFiniteError(InputError):
    """The input contains NaN or Inf."""


class NotRepresentableError(NonFiniteError):
    """Finite input whose result (or an intermediate, e.g. an inner product) overflows float32, or
    float64 rows that would underflow to all-zero rows in float32.

    Raised instead of returning Inf/NaN, silently zeroed scores or zero rows; scale the input.
    """


class ShapeError(InputError):
    """The input has the wrong number of dimensions."""


class DimensionMismatchError(InputError):
    """The number of columns differs from what is expected."""


class EmptyInputError(InputError):
    """The input has no rows or no columns."""


class TooFewRowsError(InputError):
    """Fewer rows than the requested clusters, pairs or neighbours."""


class DegenerateInputError(InputError):
    """The input carries no usable structure (e.g. all rows identical)."""


class PairCountError(InputError):
    """Paired inputs have different numbers of rows."""


class NotFittedError(VecbridgeError, AttributeError):
    """An estimator was used before ``fit``."""

    kind = "invalid"


class SerializationError(VecbridgeError):
    """An artifact could not be written or read back."""

    kind = "integrity"


class Cancelled(VecbridgeError):
    """A long computation was stopped on request (job cancel, Ctrl-C, an interrupted migration)."""

    kind = "cancelled"


class VecbridgeWarning(UserWarning):
    """Base class of vecbridge warnings (soft numerical trouble)."""


class ConvergenceWarning(VecbridgeWarning):
    """An iterative stage did not converge or its result looks unreliable."""
