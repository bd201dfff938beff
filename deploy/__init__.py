"""How engines host the service: Ray Serve (``deploy.ray``), Kubernetes and KServe
(``deploy/k8s``, ``deploy/kserve``)."""
