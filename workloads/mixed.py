"""Mixed traffic: chat, code and RAG records drawn from one seeded replay, tagged per request.

    locust -f workloads/mixed.py --host http://127.0.0.1:8000 --headless --users 4 --run-time 1m
    locust -f workloads/mixed.py --host http://127.0.0.1:8000 --headless \
        --steps 1,2,4,8,16,32 --step-time 30 --results-dir results/mixed

All spectest flags are listed in workloads/README.md. From an installed spectest,
locust -f "$(spectest locustfile mixed)" runs this file and its --help lists them too
(a start-up hook: Locust prints --help before it loads the locustfile).
"""

import sys
from pathlib import Path

try:
    import spectest.loadgen  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from locust import events

from spectest.loadgen import plugin
from spectest.loadgen.shapes import SpecShape  # noqa: F401  (Locust picks the shape up)
from spectest.loadgen.users import SpecUser

plugin.install(events, workload="mixed")


class MixedUser(SpecUser):
    workload = "mixed"
