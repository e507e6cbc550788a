"""The functions' CloudWatch metrics, locally: what CloudWatch Logs does on AWS with the embedded
metric format (EMF) records Powertools prints, this does with the lines the functions write to
stdout: each record becomes a PutMetricData on the local stack's moto server, so `admin status`
reads the same metrics from the same API as against a deployed stack. The lines come from
function_logs.py, which reads every function's output.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import queue
import threading
from typing import Any

log = logging.getLogger(__name__)


def metric_data(record: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(namespace, MetricData) per metric directive of one EMF record."""
    meta = record.get("_aws") or {}
    timestamp = dt.datetime.fromtimestamp(int(meta.get("Timestamp", 0)) / 1000, dt.UTC)
    out = []
    for directive in meta.get("CloudWatchMetrics") or []:
        data = []
        for dimension_set in directive.get("Dimensions") or [[]]:
            dimensions = [{"Name": name, "Value": str(record[name])} for name in dimension_set if name in record]
            for metric in directive.get("Metrics") or []:
                value = record.get(metric["Name"])
                values = value if isinstance(value, list) else [value]
                data.append({"MetricName": metric["Name"], "Dimensions": dimensions, "Timestamp": timestamp,
                             "Unit": metric.get("Unit") or "None", "Values": [float(v) for v in values]})
        out.append((directive["Namespace"], data))
    return out


class CloudWatchForwarder:
    """EMF records to PutMetricData, on a thread of its own (a function's output is never held up
    by moto). A record that cannot be sent is dropped with a warning: a metric lost locally must
    not stop the stack."""

    def __init__(self, cloudwatch: Any) -> None:
        self.cloudwatch = cloudwatch
        self._records: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._send, name="metrics-forwarder", daemon=True)
        self._thread.start()

    def put(self, record: dict[str, Any]) -> None:
        self._records.put(record)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (for `timeout` at most), then stop."""
        self._records.put(None)
        self._thread.join(timeout)

    def _send(self) -> None:
        while (record := self._records.get()) is not None:
            try:
                for namespace, data in metric_data(record):
                    self.cloudwatch.put_metric_data(Namespace=namespace, MetricData=data)
            except Exception as error:
                log.warning("could not forward a metric record to the local CloudWatch: %s", error)


def emf_record(line: str) -> dict[str, Any] | None:
    """The EMF record a line holds, or None."""
    return _emf(line)


def _emf(line: str) -> dict[str, Any] | None:
    if '"_aws"' not in line:
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("_aws"), dict) else None
