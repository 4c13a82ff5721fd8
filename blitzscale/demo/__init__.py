"""`blitzscale demo`: a CPU cluster replays a real burst, scales, and is compared with a
baseline policy."""
