"""What operators see: metrics, the request log, the event log and the operator page's
aggregation, cost accounting, readiness, and the worker's memory after a peak."""
