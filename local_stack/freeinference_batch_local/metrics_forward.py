"""The functions' CloudWatch metrics, locally: what CloudWatch Logs does on AWS with the embedded
metric format (EMF) records Powertools prints, this does with the lines the functions write to
stdout: each record becomes a PutMetricData on the local stack's moto server, so `admin status`
reads the same metrics from the same API as against a deployed stack. Every other line passes on.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import queue
import threading
from typing import Any, TextIO

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


class MetricsForwarder(io.TextIOBase):
    """A stdout that sends EMF lines to CloudWatch (on a thread of its own) and writes the rest on."""

    def __init__(self, stream: TextIO, cloudwatch: Any) -> None:
        self.stream = stream
        self.cloudwatch = cloudwatch
        self._partial = ""
        self._lock = threading.Lock()
        self._records: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._send, name="metrics-forwarder", daemon=True).start()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._partial += text
            *lines, self._partial = self._partial.split("\n")
        for line in lines:
            record = _emf(line)
            if record is None:
                self.stream.write(line + "\n")
            else:
                self._records.put(record)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def _send(self) -> None:
        while True:
            record = self._records.get()
            try:
                for namespace, data in metric_data(record):
                    self.cloudwatch.put_metric_data(Namespace=namespace, MetricData=data)
            except Exception:  # a metric lost locally must not stop the stack
                log.exception("could not forward a metric record to the local CloudWatch")


def _emf(line: str) -> dict[str, Any] | None:
    if '"_aws"' not in line:
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("_aws"), dict) else None
