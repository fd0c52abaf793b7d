"""The bundled Locust workloads: ``chat.py``, ``code.py``, ``rag.py``, ``mixed.py`` and their
datasets under ``data/`` (see ``workloads/README.md``).

A package only so that a wheel carries the folder (installed beside ``spectest``); the
locustfiles are run by path, never imported from here: ``locust -f "$(spectest locustfile chat)"``.
"""
