"""The HTTP face: a FastAPI app over the serving core (``service.dataplane``).

``app.py`` builds it, ``v1.py``, ``v2.py`` and ``activations.py`` are its routes, ``routing.py``
how they are registered, ``middleware.py`` the body limit, metrics and start-up refusals,
``schemas.py`` and ``openapi.py`` its documentation.
"""
