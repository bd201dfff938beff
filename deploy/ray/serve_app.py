"""The service on Ray Serve: ``serve run deploy/ray/serve.yaml`` (or ``serve deploy``).

Each replica builds the service's own HTTP app (``service.rest.app.create_app``) from the
``GELU_*`` variables of its runtime environment, with its serving core: the same routes,
codecs, batcher, limits and errors as ``gelu-serve serve``, behind Ray's HTTP proxy.
"""

from __future__ import annotations

from ray import serve

from service.rest.app import create_app

# The app is built in each replica when it starts (Ray calls the builder there), never in
# the process that deploys: the settings are the replica's, from the config's runtime_env.
GeluServe = serve.deployment(name="gelu-serve")(serve.ingress(create_app)())
app = GeluServe.bind()
