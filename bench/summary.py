"""The figures that need more than one phase of the same run: the pipeline's CPU per event
against the sum of the minimal parts, and the pipeline against the Celery peer."""

from bench import stats
from bench.celery_peer import best_step, pipeline_cpu_ms


def minimal_parts(report: dict) -> dict | None:
    """CPU ms per event of the least each part of the pipeline can do, from this run's
    baselines: the minimal view's web processes (parse and answer, no send); the no-op
    consumer with the SQS server's share (receive and delete); and the batched floor's database
    work (its consumer's CPU beyond the no-op consumer's, and its PostgreSQL backend's). None
    when a phase or figure is missing."""
    ingest, worker = report.get("ingest"), report.get("worker")
    if not ingest or not worker:
        return None
    runs = worker["runs"]
    noop, batched = runs.get("noop_1"), runs.get("batchedsql_1")
    web = (ingest.get("minimal") or {}).get("web_cpu_ms_per_request")
    if not noop or not batched or web is None:
        return None
    needed = (
        noop.get("consumer_cpu_ms_per_event"),
        noop.get("sqs_cpu_ms_per_event"),
        batched.get("consumer_cpu_ms_per_event"),
        batched.get("postgres_cpu_ms_per_event"),
    )
    if any(v is None for v in needed):
        return None
    noop_cpu, noop_sqs, batched_cpu, batched_pg = needed
    parts = {
        "web": round(web, 3),
        "queue": round(noop_cpu + noop_sqs, 3),
        "database": round(max(batched_cpu - noop_cpu, 0.0) + batched_pg, 3),
    }
    parts["total"] = round(sum(parts.values()), 3)
    return parts


def cross_phase(report: dict) -> None:
    """Add the cross-phase figures to ``report`` (in place), where their phases ran."""
    e2e, peer = report.get("e2e"), report.get("peer")
    pipeline_cpu = pipeline_cpu_ms(best_step(e2e)) if e2e else None
    if e2e:
        e2e["pipeline_cpu_ms_per_event"] = pipeline_cpu
        parts = minimal_parts(report)
        e2e["minimal_parts_cpu_ms_per_event"] = parts
        e2e["cpu_vs_minimal_parts"] = (
            stats.ratio(parts["total"], pipeline_cpu) if parts and pipeline_cpu else None
        )
    if e2e and peer:
        peer["pipeline_vs_celery_sustained"] = stats.ratio(
            e2e.get("sustained_events_per_second"), peer.get("celery_sustained_events_per_second")
        )
        peer["pipeline_vs_celery_cpu"] = stats.ratio(
            pipeline_cpu, peer.get("celery_cpu_ms_per_event")
        )
        # Each at its own best above; here both at the highest rate both sustained, where the
        # idle share of each part's CPU is spread over the same number of events.
        common = _common_rate(e2e, peer)
        peer["common_sustained_rate"] = common
        peer["pipeline_vs_celery_cpu_same_rate"] = (
            stats.ratio(
                pipeline_cpu_ms(_step_at(e2e, common)), pipeline_cpu_ms(_step_at(peer, common))
            )
            if common
            else None
        )


def _sustained_rates(out: dict) -> set[int]:
    return {s["offered_rate"] for s in out.get("steps", []) if s["sustained"]}


def _common_rate(e2e: dict, peer: dict) -> int | None:
    return max(_sustained_rates(e2e) & _sustained_rates(peer), default=None)


def _step_at(out: dict, rate: int) -> dict | None:
    return next((s for s in out.get("steps", []) if s["offered_rate"] == rate), None)
