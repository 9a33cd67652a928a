"""The HTTP service: ``create_app(settings)`` builds the FastAPI app, ``serve(settings)`` runs it.

Layout: :mod:`.app` (factory, lifespan), :mod:`.deps` (settings, state, auth), :mod:`.errors`
(the one exception → status mapping), :mod:`.schemas`, :mod:`.codec` (vector wire formats),
:mod:`.middleware`, :mod:`.state`, and one router per resource in :mod:`.routers`.
"""

from .app import API_DESCRIPTION, create_app, serve

__all__ = ["create_app", "serve", "API_DESCRIPTION"]
