"""Tests of the control-plane policies: pure functions over hand-built snapshots (CPU, no I/O)."""
