"""Control plane policies: pure functions over cluster snapshots, shared by the live router
and the simulator."""
