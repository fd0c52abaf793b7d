"""Build hook: one file the wheel carries outside any package, ``spectest-locust-help.pth``.

Python runs it at start-up from site-packages; it makes ``locust -f <workload> --help`` list
spectest's flags (why and how: ``spectest/loadgen/locust_help.py``, which also holds its text).
Everything else about the package (metadata, packages, data files) is in ``pyproject.toml``.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _locust_help():
    path = HERE / "spectest" / "loadgen" / "locust_help.py"  # standard library only at import
    spec = importlib.util.spec_from_file_location("_spectest_locust_help", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        h = _locust_help()
        target = Path(self.build_lib) / h.PTH_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(h.PTH_LINE, encoding="utf-8")

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode),
                str(Path(self.build_lib) / _locust_help().PTH_NAME)]


setup(cmdclass={"build_py": BuildPyWithPth})
