"""Typed errors and warnings raised by :mod:`align`.

One small tree, so callers can catch as broadly or as narrowly as they like::

    VecbridgeError
    ├── InputError (also ValueError)          bad arrays handed to a public function
    │   ├── NonFiniteError                    NaN or Inf in the data
    │   │   └── NotRepresentableError         finite input whose result float32 cannot hold
    │   ├── ShapeError                        wrong ndim (1-D, 3-D, ...)
    │   ├── DimensionMismatchError            columns differ from what the map/frame expects
    │   ├── EmptyInputError                   zero rows or zero columns
    │   ├── TooFewRowsError                   fewer rows than clusters / pairs / neighbours asked for
    │   ├── DegenerateInputError              rank-deficient data (e.g. all rows identical)
    │   └── PairCountError                    paired arrays with different row counts
    ├── NotFittedError (also AttributeError)  transform/map_ used before fit
    └── SerializationError                    an artifact that cannot be read back

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
    "VecbridgeWarning",
    "ConvergenceWarning",
]


class VecbridgeError(Exception):
    """Base class of every error raised on purpose by vecbridge."""


class InputError(VecbridgeError, ValueError):
    """The input arrays are not usable; the message says what was expected."""


class NonFiniteError(InputError):
    """The input contains NaN or Inf."""


class NotRepresentableError(NonFiniteError):
    """Finite input whose result (or an intermediate, e.g. an inner product) overflows float32.

    Raised instead of returning Inf/NaN or silently zeroed scores; scale the input down.
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


class SerializationError(VecbridgeError):
    """An artifact could not be written or read back."""


class VecbridgeWarning(UserWarning):
    """Base class of vecbridge warnings (soft numerical trouble)."""


class ConvergenceWarning(VecbridgeWarning):
    """An iterative stage did not converge or its result looks unreliable."""
