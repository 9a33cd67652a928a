"""The web console at ``/ui`` and the offline Swagger UI at ``/docs``: a face, like ``service/api``.

Pages are Jinja2 shells (layout, labelled forms, empty tables); every figure on them is fetched
by the browser from the public ``/v1`` API with the key the user typed once per browser session
(``sessionStorage``, sent as ``Authorization: Bearer``; never in a URL, a cookie or a log). The
pages themselves carry no data, so serving them without a key opens no back door: without a key
the console shows the API's own 401 answer.

Static assets (Alpine.js, uPlot, Swagger UI) are vendored under ``static/`` with their licences
and shipped as package data; nothing is fetched from a CDN.
"""

from __future__ import annotations

from .pages import STATIC_DIR, mount_console

__all__ = ["mount_console", "STATIC_DIR"]
