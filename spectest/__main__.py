import sys

from spectest.cli import main

sys.exit(main())
