"""`python -m vela2.api.systemone --write-schemas [--dir DIR]`: write the SystemOne JSON Schemas."""

from vela2.api.systemone import main

raise SystemExit(main())
