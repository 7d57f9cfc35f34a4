"""`vela2 loadtest`: open-loop load against any running deployment, as real traffic comes.

Requests arrive at a set rate with exponential gaps (Poisson arrivals), each sent at its time
whether or not earlier ones were answered (open loop: a slow server cannot slow the arrivals down,
so its queueing shows in the latencies). A run measures each rate (or each fraction of a capacity
it first measures with a closed-loop flood) for a warm-up and a measured window, through the
product's own producers: `producer.AsyncClient` on a Redis URL, or the HTTP route
(POST /v1/system_one) with an API key. It reports, per rate: requests sent in the window, answered
(ok / error), lost (no answer within the timeout), achieved throughput, end-to-end latency p50 /
p90 / p99 / max from each request's scheduled arrival, the stages of the answers' own timings
(queue / render / model / decode), and how far the client itself lagged behind its schedule; it
writes them as JSON with the command and the machine. Modules: `workload` (what is sent),
`drivers` (how: Redis or HTTP), `openloop` (when: the schedule, the processes, the capacity probe),
`report` (percentiles and the summary), `cli` (the command)."""
