"""Text handling: words, windows, span decoding and packing (no torch)."""
