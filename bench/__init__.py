"""``make bench``: throughput and latency of the callback endpoint, the queue worker and the
whole pipeline, each measured beside a baseline in the same run (see docs/benchmarks.md)."""
