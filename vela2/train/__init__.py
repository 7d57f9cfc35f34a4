"""Training and fitting: train, calibrate, evaluate, the synthetic data, the demo model, import."""
