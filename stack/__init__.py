"""The whole stack on one machine: the process harness (redis-server and worker processes), the
demo and the parity report. It sits above both sides (it drives a producer client against real
worker processes), so neither `worker` nor `producer` imports it."""
