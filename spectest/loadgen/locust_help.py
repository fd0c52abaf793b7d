"""Make ``locust -f <a spectest locustfile> --help`` list spectest's flags.

Why it is needed: Locust (2.x, up to 2.47 at least) handles ``--help`` in
``parse_locustfile_option``, *before* it imports any locustfile, so the
``init_command_line_parser`` listener that a locustfile registers (``plugin.install``) never runs
for ``--help`` (upstream: locustio/locust#2917). A listener shows in ``--help`` only if it is
registered before Locust's ``main()`` starts — and the one module Locust imports by itself for
that, ``locust_plugins``, belongs to another project.

So the wheel installs ``spectest-locust-help.pth`` into site-packages (``setup.py`` puts it there;
``PTH_LINE`` is its one line). Python runs that line at start-up; it does nothing unless
``-h``/``--help`` is on the command line. Then ``maybe_register()`` checks that this process is
Locust (the ``locust`` script or ``python -m locust``) and that a locustfile it names (``-f``,
``--locustfile``, ``$LOCUST_LOCUSTFILE``, default ``locustfile.py``) installs spectest's plugin,
and only then registers ``options.add_arguments`` on ``locust.events`` — the same flags the
locustfile adds on a real run, where this module does nothing. It never raises (a failure must not
break Python's start-up): at worst ``--help`` stays as Locust prints it.

Standard library only until it decides to register.
"""

from __future__ import annotations

import os
import sys

PTH_NAME = "spectest-locust-help.pth"
PTH_LINE = ('import sys; ("-h" in sys.argv or "--help" in sys.argv) and '
            '__import__("spectest.loadgen.locust_help").loadgen.locust_help.maybe_register()\n')
MARKER = "spectest.loadgen"  # a locustfile that imports from here installs the plugin
_registered = False


def is_locust(argv: list[str], orig_argv: list[str]) -> bool:
    """This process is Locust's command line: its script, or ``python -m locust``."""
    if argv and os.path.basename(argv[0]) in ("locust", "locust.exe", "locust-script.py"):
        return True
    for i, arg in enumerate(orig_argv[:-1]):
        if arg == "-m":
            return orig_argv[i + 1] == "locust"
    return False


def locustfiles(argv: list[str], environ: dict[str, str] | os._Environ) -> list[str]:
    """The locustfile paths on the command line (the last ``-f`` wins, as in argparse)."""
    value = environ.get("LOCUST_LOCUSTFILE", "locustfile.py")
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-f", "--locustfile"):
            value = next(args, value)
        elif arg.startswith("--locustfile="):
            value = arg.split("=", 1)[1]
        elif arg.startswith("-f") and not arg.startswith("--"):
            value = arg[2:].lstrip("=")
    return [p.strip() for p in value.split(",") if p.strip()]


def uses_spectest(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            return MARKER in fh.read()
    except (OSError, UnicodeDecodeError):
        return False


def maybe_register() -> None:
    """Called by the ``.pth`` line at start-up when ``--help`` is asked for; see the module doc."""
    try:
        if _registered or not is_locust(sys.argv, getattr(sys, "orig_argv", [])):
            return
        if not any(uses_spectest(p) for p in locustfiles(sys.argv, os.environ)):
            return
        register()
    except Exception:  # noqa: BLE001 — never break interpreter start-up over a help text
        pass


def register() -> None:
    """Add spectest's flags to every parser Locust builds from now on (once per process)."""
    global _registered
    if _registered:
        return
    import locust

    from spectest.loadgen import options

    locust.events.init_command_line_parser.add_listener(
        lambda parser, **_kw: options.add_arguments(parser))
    _registered = True
