"""Tests of the trace-replay client (CPU only, loopback only)."""
