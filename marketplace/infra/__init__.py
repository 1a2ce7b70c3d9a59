"""Infrastructure the site leans on: the replay buffer's Redis client, telemetry and liveness in Redis, refusal counts,
and the operator's probes and metrics."""
