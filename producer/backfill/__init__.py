"""`vela2 backfill IN.jsonl OUT.jsonl`: bulk scoring through the queue, bounded and resumable.

    run_backfill("in.jsonl", "out.jsonl", redis_url="redis://127.0.0.1:6379/0", model="vela2-demo",
                 window=1024, chunk_size=16)

- Streams IN line by line: each line a row or a SystemOne request (told apart by their keys).
- Deterministic ids: the request's own "id", else its content hash (`vela2.wire.messages.request_id`);
  a line with no id it can be answered under (not JSON, not an object, or an id that cannot name a
  request, such as one with a lone surrogate) is `line-<N>-<hash>` (1-based N, 12 hex digits of the
  line's bytes: `line_id`), never a caller's id.
- Resumable: OUT is read first and every id in it is skipped; a torn last line (no newline: the
  previous run was killed while writing it) is truncated before appending. `retry="timeouts"`
  (`--retry timeouts`) takes the lines this command wrote for rows that got no answer (error types
  "timeout" and "result_expired", e.g. while no worker ran) out of OUT and scores those rows again;
  `retry="errors"` does so for every line that is not ok (error of any type, expired, cancelled),
  and first deletes such a stored answer from Redis (`DROP_FAILED_SCRIPT`: only when it is not ok),
  since the write-once result store would otherwise hand the same failure back. OUT is rewritten
  without those lines (streamed to a temporary file, then renamed over it). Each result is
  appended as one whole line by one unbuffered write (fsync at exit), so killing the job at any
  moment and rerunning it ends with every id in OUT exactly once. Requests that were in flight when
  the job died are not lost: their results are read back from Redis (or they are queued again;
  the worker's write-once store answers a duplicate id once; a row whose earlier answer has
  expired from Redis meanwhile is queued again too, and counted in `rescored`).
- Backpressure: at most `window` rows are in flight (queued, being scored, or answered but not yet
  written); a chunk is queued only when it fits. `BackfillSummary.max_in_flight` records the peak.
- Bulk mode: rows travel `chunk_size` to a message on the model's backfill queue (lower priority
  than the online queue); results are polled with one pipelined MGET over the ids in flight every
  `poll_s` seconds.
- Nothing is silently missing: a bad line gets an error line at once (never queued); a row with
  no result after `timeout_s` gets an error line of type "timeout"; a row answered during this run
  whose answer expired from the result store before this run read it (`result_expires` shorter than
  the wait) gets an error line of type "result_expired" at the next poll (submissions are tracked:
  see producer.client); a later duplicate of an id within IN is not scored again (the first
  occurrence wins) and is counted in the summary.
- Redis outages: every Redis call (the recovery read, the push, the polls) is retried on
  redis ConnectionError / TimeoutError / BusyLoadingError (a restart, AOF loading) with backoff
  (0.05 s doubling to 2 s) for up to `redis_timeout_s` (default `timeout_s`) per outage; then the run
  resumes where it was (rows keep their submission times, so their `timeout_s` still bounds them).
  Pushes that failed mid-way are sent again whole: duplicates are answered once. An outage longer
  than that raises `RedisUnavailable`; `vela2 backfill` prints it as one line and exits 3 (what was
  written stays; rerun to resume).
- No worker? When nothing has been answered for `stall_warn_s` (default 60 s) while rows are in
  flight and the model's backfill queue has not shrunk meanwhile, a warning says so, with the
  number of live workers of the model (their heartbeats); once per stall.
- Progress on stderr (vela2.progress: lines/s, ETA over the line count of IN): a bar when stderr
  is a terminal (or `progress=True`), else a line every few seconds (`progress=False`: none); one
  summary line at the end.

Memory: the input is streamed and at most `window` requests are held; the sets of ids already in
OUT and already seen in IN (resume, duplicates) grow with the number of distinct ids (a few tens
of bytes each), never with the size of the rows. No torch.

Modules: `run` (run_backfill: arguments checked, OUT prepared, the run), `window` (the windowed submit
loop, Redis outages, stall warnings), `output` (OUT: resuming, retries, whole-line writes), `lines`
(an input line's id, error lines), `summary` (BackfillSummary), `cli` (`vela2 backfill`).
"""

from producer.backfill.cli import EXIT_REDIS_UNAVAILABLE, main
from producer.backfill.run import run_backfill
from producer.backfill.summary import BackfillSummary
from producer.backfill.window import RedisUnavailable

__all__ = ["EXIT_REDIS_UNAVAILABLE", "BackfillSummary", "RedisUnavailable", "main", "run_backfill"]
