"""Where messages come from: Redis (the atomic take; every kombu internal we touch) and RabbitMQ."""
