"""The worker's runtime: start-up, the device runner, the CPU processes, visibility leases."""
