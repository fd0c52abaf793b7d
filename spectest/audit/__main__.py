"""``python -m spectest.audit ...`` — the same as ``spectest audit ...``."""

import sys

from spectest.audit.cli import build_parser, main

sys.exit(main(build_parser().parse_args()))
