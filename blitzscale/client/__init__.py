"""Trace-replay client: read request traces, replay them open-loop against a server, report.

Modules by role: `traces` (trace files -> requests, synthetic arrivals, transforms),
`record` (what one replayed request measured), `replay` (the asyncio sender), `summary`
(percentiles, SLO attainment, throughput: pure functions), `report` (plots and HTML), `cli`.
"""
