"""Load generation for speculative decoding: Locust users, shapes, scraping and results.

Modules: ``datasets`` (records and replay), ``client`` (one timed streamed completion),
``users`` (the Locust user), ``shapes`` (stepped / Poisson load), ``scrape`` (``/metrics``
acceptance deltas), ``results`` (``requests.jsonl`` + ``steps.csv``), ``run`` and ``plugin``
(Locust wiring), ``runner`` (a headless run as a subprocess), ``stub`` (a test server).

Nothing here imports torch or asyncio-only code (the stub server is the one aiohttp module,
run as its own process); ``load_dataset`` is the entry point other tools import.
"""

from spectest.loadgen.datasets import Dataset, Record, load_dataset

__all__ = ["Dataset", "Record", "load_dataset"]
