"""`python -m bench.faults ...`: the fault suite's command line (bench.faults.cli)."""

import sys

from bench.faults.cli import main

sys.exit(main())
