"""The request API: rows, results and SystemOne requests (pydantic; no torch)."""
