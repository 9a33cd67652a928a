"""The pair fits a notebook user calls first document every parameter they take (``fit_ridge`` and ``fit_lowrank``
had one-line docstrings: ``help(align.fit_ridge)`` said nothing of alpha, fit_intercept, center, normalize)."""

import inspect
import re

import pytest

import align


@pytest.mark.parametrize("fit", [align.fit_procrustes, align.fit_ridge, align.fit_lowrank])
def test_every_parameter_is_described(fit):
    doc = inspect.getdoc(fit)
    assert "Parameters\n----------" in doc, fit.__name__
    described = doc.split("Parameters\n----------", 1)[1]
    names = [n for n in inspect.signature(fit).parameters if n not in ("X", "Y")]
    missing = [n for n in names if not re.search(rf"^\s*(\w+, )*{n}\b", described, re.MULTILINE)]
    assert not missing, (fit.__name__, missing)
