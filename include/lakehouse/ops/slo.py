"""Freshness and lag SLO checks over `status.pipeline_status`, shared by sensors, triggers and the CLI.

Freshness: the newest committed event time and the last commit must both be at
most `freshness_s` old. Lag: the records between the tables' positions and the
Kafka log end, and the age of the oldest of them (`lag_s`, 0 when caught up),
must stay within `lag_records` / `lag_s`. Each check returns an `SloCheck` whose
message says which limit was missed and by how much.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

KINDS = ("freshness", "lag")


@dataclass(frozen=True)
class SloCheck:
    kind: str  # freshness | lag
    pipeline: str
    ok: bool
    measured: dict[str, float | None]
    limits: dict[str, float]
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


def _over(name: str, value: float | None, limit: float, unit: str) -> str | None:
    """A sentence when `value` misses `limit` (None counts as a miss), else None."""
    if value is None:
        return f"{name} is unknown (limit {limit:g}{unit})"
    if value > limit:
        return f"{name} is {value:g}{unit}, {value - limit:g}{unit} over the {limit:g}{unit} limit"
    return None


def _verdict(kind: str, pipeline: str, measured: dict, limits: dict, misses: list[str | None]) -> SloCheck:
    missed = [m for m in misses if m]
    if missed:
        message = f"{pipeline}: {kind} SLO missed: " + "; ".join(missed)
    else:
        message = f"{pipeline}: {kind} within SLO: " + ", ".join(
            f"{k} {measured[k]:g} <= {limits[k]:g}" for k in limits)
    return SloCheck(kind, pipeline, not missed, measured, limits, message)


def check_freshness(status: dict, max_event_age_s: float, max_commit_age_s: float) -> SloCheck:
    """The newest committed event time and the last commit, each against its limit (seconds)."""
    measured = {"event_age_s": status.get("freshness_s"), "commit_age_s": status.get("seconds_since_commit")}
    limits = {"event_age_s": float(max_event_age_s), "commit_age_s": float(max_commit_age_s)}
    return _verdict("freshness", status["pipeline"], measured, limits, [
        _over("age of the newest committed event", measured["event_age_s"], limits["event_age_s"], "s"),
        _over("age of the last commit", measured["commit_age_s"], limits["commit_age_s"], "s"),
    ])


def check_lag(status: dict, max_records: int, max_seconds: float) -> SloCheck:
    """Records not yet in the tables and the age of the oldest of them, against their limits."""
    kafka = status.get("kafka") or {}
    measured = {"lag_records": status.get("lag_records"), "lag_s": status.get("lag_s")}
    limits = {"lag_records": float(max_records), "lag_s": float(max_seconds)}
    misses = [_over("lag", measured["lag_records"], limits["lag_records"], " records"),
              _over("age of the oldest unconsumed record", measured["lag_s"], limits["lag_s"], "s")]
    if "error" in kafka:
        misses.insert(0, f"Kafka cannot be read: {kafka['error']}")
    return _verdict("lag", status["pipeline"], measured, limits, misses)


def unavailable(kind: str, pipeline: str, limits: dict[str, float], error: BaseException) -> SloCheck:
    """A failed check for when the status itself could not be read (catalog or Kafka down)."""
    return SloCheck(kind, pipeline, False, {k: None for k in limits}, limits,
                    f"{pipeline}: {kind} SLO cannot be checked: {type(error).__name__}: {error}")


def evaluate(kind: str, status: dict, limits: dict[str, float]) -> SloCheck:
    """`check_freshness` or `check_lag` with `limits` as returned in SloCheck.limits.

    Raises ValueError for an unknown kind."""
    if kind == "freshness":
        return check_freshness(status, limits["event_age_s"], limits["commit_age_s"])
    if kind == "lag":
        return check_lag(status, int(limits["lag_records"]), limits["lag_s"])
    raise ValueError(f"unknown SLO kind {kind!r}; one of {', '.join(KINDS)}")
