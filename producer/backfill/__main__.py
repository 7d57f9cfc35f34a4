"""`python -m producer.backfill IN.jsonl OUT.jsonl ...`: `vela2 backfill` from a checkout that is not
installed (warnings on stderr, as the vela2 CLI logs them)."""

import logging
import sys

from producer.backfill.cli import main

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
sys.exit(main())
