"""Load tests and benchmarks of the inference path (``make bench``, ``bench/locustfile.py``)."""
