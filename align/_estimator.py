"""The scikit-learn estimator protocol for :class:`align.MiniVec2Vec`, without scikit-learn.

``get_params(deep=True)`` / ``set_params(**params)`` as ``sklearn.base.clone`` and grid searches call them (the
parameters are the keyword arguments of ``__init__``, stored unchanged under their own names), a repr that shows the
parameters set away from their defaults, and the fitted attributes (``map_``...) raising
:class:`~align.exceptions.NotFittedError` before ``fit`` instead of a bare AttributeError.

scikit-learn 1.6 and later ask every estimator for ``__sklearn_tags__`` (``GridSearchCV.fit``, ``Pipeline.transform``
and ``check_is_fitted`` raised AttributeError without it) and read ``__sklearn_is_fitted__``; both are here, the
tags built from scikit-learn only when it asks for them (align does not import it).
"""

from __future__ import annotations

import inspect

from .exceptions import InputError, NotFittedError

__all__ = ["Estimator"]


class Estimator:
    """Base of an estimator whose ``__init__`` takes keyword parameters and stores each as an attribute."""

    #: the attributes ``fit`` sets: reading one before ``fit`` is a NotFittedError
    _fitted_attrs: tuple[str, ...] = ()

    @classmethod
    def _param_defaults(cls) -> dict:
        """``{name: default}`` of the keyword parameters of ``__init__``, in its order."""
        sig = inspect.signature(cls.__init__)
        return {n: p.default for n, p in sig.parameters.items()
                if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}

    def get_params(self, deep: bool = True) -> dict:
        """The constructor's parameters, ``{name: value}`` (``deep``: sklearn's flag; no parameter is an
        estimator, so it changes nothing)."""
        return {name: getattr(self, name) for name in self._param_defaults()}

    def set_params(self, **params):
        """Set constructor parameters by name and return ``self`` (checked at the next ``fit``); InputError naming
        the valid parameters for an unknown name, before any is set."""
        valid = self._param_defaults()
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise InputError(f"{type(self).__name__} has no parameter(s) {', '.join(map(repr, unknown))}; "
                             f"valid parameters: {', '.join(valid)}")
        for name, value in params.items():
            setattr(self, name, tuple(value) if isinstance(value, list) and isinstance(valid[name], tuple)
                    else value)  # as __init__ stores a list given for a tuple parameter (refine)
        return self

    def __sklearn_is_fitted__(self) -> bool:
        """Whether ``fit`` has run (every fitted attribute set): what ``sklearn.utils.validation.check_is_fitted``
        asks."""
        return all(name in self.__dict__ for name in type(self)._fitted_attrs)

    def __sklearn_tags__(self):
        """scikit-learn's tags (1.6+, imported here, when scikit-learn asks): a transformer whose ``fit`` needs its
        second argument (the target rows, as ``y``), float32 output."""
        from sklearn.utils import Tags, TargetTags, TransformerTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=True),
                    transformer_tags=TransformerTags(preserves_dtype=["float32"]))

    def __repr__(self) -> str:
        changed = []
        for name, default in self._param_defaults().items():
            value = getattr(self, name, default)
            try:
                same = value is default or bool(value == default)
            except (TypeError, ValueError):  # an array: not comparable to a default in one bool
                same = False
            if not same:
                changed.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(changed)})"

    def __getattr__(self, name: str):
        """Only for attributes not set: a fitted one is a NotFittedError before ``fit``."""
        if name in type(self)._fitted_attrs:
            raise NotFittedError(f"{type(self).__name__} is not fitted yet: {name} is set by fit; call fit first")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
