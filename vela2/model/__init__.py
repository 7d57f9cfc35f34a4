"""The model: checkpoint I/O, the decoder with its heads, attention, the fused decoder, staging, calibration."""
