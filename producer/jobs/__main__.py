"""`python -m producer.jobs ...`: `vela2 jobs` from a checkout that is not installed (the CLI reference's
promise for every subcommand; before the package, `python -m producer.jobs` ran nothing)."""

import logging
import sys

from producer.jobs.cli import main

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
sys.exit(main())
