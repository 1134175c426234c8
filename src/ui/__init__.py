"""``effectful-durable ui``: a local web page over a database (the ``ui`` extra): it
shows every agent, and decides approvals and acts through the Store's own calls.

``app.py`` puts the page together (routes, the guard, error pages, the lifespan);
``guard.py`` decides who may see it and which forms may act; ``live.py`` turns
the store's commit watch into server-sent events; ``render.py`` holds the
templates' environment; ``pages/`` has one module per kind of page;
``serve.py`` is the command. ``templates/`` and ``static/`` (htmx, its SSE
extension and Pico CSS, vendored; our CSS and form checks) ship inside the
package. Starlette, uvicorn and Jinja2 are imported here and
below only; this package imports the store and the errors, never effectful's
LLM layer, so litellm is never loaded.
"""

from .app import make_app
from .serve import serve

__all__ = ["make_app", "serve"]
