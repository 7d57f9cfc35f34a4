"""The batching engine: one thread owns the state (loop), intake opens messages and sends them to
render, the scheduler forms and launches batches, the outbox stores results and acks."""
